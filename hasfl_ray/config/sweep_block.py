"""A sweep config's ``sweep:`` block: its keys, checked, and the one run ``simulate --config`` takes from it.

:mod:`hasfl_ray.sweep` plans a sweep's cells from this block; a plain run takes its values through
:func:`single_run_values` without any sweep code."""

from __future__ import annotations

from dataclasses import fields
from typing import Any, Dict, List, Mapping, Optional, Tuple

from hasfl_ray.config.routing import option_fields, option_owners
from hasfl_ray.config.schema import RunConfigFields
from hasfl_ray.errors import ConfigError


#: The key of a sweep config's ``sweep:`` block (hasfl_ray.sweep) and the keys that block takes.
SWEEP_KEY = "sweep"
SWEEP_FIELDS = ("reproduces", "datasets", "algorithms", "seeds", "per_dataset", "variants", "out")


def split_sweep_config(values: Mapping[str, Any], source: str) -> Tuple[Optional[Dict[str, Any]], Dict[str, Any]]:
    """(the ``sweep:`` block or None, the shared RunConfig keys) of a config file's mapping; one sentence when the
    block is malformed, or when a key that cannot apply is given (a seed, dataset or algorithm that the sweep's
    lists set for each cell, in another layer)."""
    shared = {k: v for k, v in values.items() if k != SWEEP_KEY}
    if SWEEP_KEY not in values:
        return None, shared
    block = values[SWEEP_KEY]
    if not isinstance(block, dict):
        raise ConfigError(f"{source} has a sweep block of type {type(block).__name__}; expected a mapping with keys "
                          + ", ".join(SWEEP_FIELDS))
    block = {str(k).replace("-", "_"): v for k, v in block.items()}
    unknown = sorted(set(block) - set(SWEEP_FIELDS))
    if unknown:
        raise ConfigError(f"{source} has unknown sweep key {unknown[0]!r}; expected one of {', '.join(SWEEP_FIELDS)}")
    for name in ("per_dataset", "variants"):
        mapping = block.get(name) or {}
        if not isinstance(mapping, dict) or not all(isinstance(v, dict) for v in mapping.values()):
            raise ConfigError(f"{source} has sweep.{name} {mapping!r}; expected a mapping of names to mappings of "
                              "config keys")
        block[name] = {str(k): {str(kk).replace("-", "_"): vv for kk, vv in v.items()} for k, v in mapping.items()}
    out = block.get("out")
    if out is not None and (not isinstance(out, str) or not out.strip()):
        raise ConfigError(f"{source} has sweep.out {_shown(out)}; expected a folder path such as runs/table3")
    # a key the sweep sets for each cell (sweep.datasets, seeds, algorithms) never reaches a cell from another
    # layer: refused by name, never dropped (a variant names its algorithm: that is what a variant is)
    for key in ("dataset", "seed", "algorithm"):
        for layer in ("per_dataset", "variants") if key != "algorithm" else ("per_dataset",):
            for name, keys in block[layer].items():
                if key in keys:
                    raise ConfigError(f"{source} has {key} {_shown(keys[key])} in sweep.{layer}.{name}, but the "
                                      f"sweep sets each cell's {key}; expected it in sweep.{key}s")
        if key in shared and block.get(key + "s") is not None:
            raise ConfigError(f"{source} has {key} {_shown(shared[key])} and sweep.{key}s "
                              f"{_shown(block[key + 's'])}, but sweep.{key}s names every cell's {key}; expected one "
                              "of them")
    for name, keys in block["variants"].items():
        _check_variant_options(name, keys, shared, source)
    return block, shared


def _check_variant_options(name: str, keys: Mapping[str, Any], shared: Mapping[str, Any], source: str) -> None:
    """Refuse, by name, an option a variant sets that its own algorithm does not take (``{algorithm: hasfl, mu:
    0.5}``): a variant's keys are its own, never a shared file's that other algorithms take, so nothing of it is
    dropped. Unknown keys are left to the sweep's key check, which names the nearest."""
    algorithm = keys.get("algorithm", shared.get("algorithm", RunConfigFields.algorithm))
    if not isinstance(algorithm, str) or not algorithm:
        return  # RunConfig names the bad value
    known = {f.name for f in fields(RunConfigFields)}
    given = keys.get("algorithm_options")
    flat = [(key, keys[key]) for key in keys if key not in known]
    nested = [(key, value) for key, value in given.items()] if isinstance(given, Mapping) else []
    if not flat and not nested:
        return
    own, owners = option_fields(algorithm), option_owners()
    for key, value in flat + nested:
        if key not in own and (key in owners or (key, value) in nested):
            takers = owners.get(key)
            raise ConfigError(f"{source} has {key} {_shown(value)} in sweep.variants.{name}, but its algorithm "
                              f"{algorithm!r} takes no option {key!r}; expected "
                              + (f"it only in a variant of {' or '.join(takers)}" if takers else
                                 f"one of its options: {', '.join(own) or 'it has none'}"))


def _shown(value: Any) -> str:
    """``repr(value)``, cut short when long (a sentence names the value, never pages of it)."""
    text = repr(value)
    return text if len(text) <= 60 else text[:40] + f"... ({len(text)} characters)"


def sweep_list(value: Any, name: str, source: str) -> List[Any]:
    """A sweep block's ``datasets``/``algorithms``/``seeds`` entry as a list (empty when absent; one value as a
    list of one); one sentence when it is neither one value nor a non-empty list, or when an entry is not a name
    (``seeds``: not a non-negative integer)."""
    if value is None:
        return []
    if isinstance(value, (str, int)) and not isinstance(value, bool):
        value = [value]
    if not isinstance(value, list) or not value:
        raise ConfigError(f"{source} has sweep.{name} {_shown(value)}; expected a non-empty list")
    for item in value:  # names are strings, seeds integers: a mapping or list among them is one sentence
        if name == "seeds" and (not isinstance(item, int) or isinstance(item, bool) or item < 0):
            raise ConfigError(f"{source} has seed {_shown(item)} in sweep.seeds; expected non-negative integers "
                              "such as 42, 43, 44")
        if name != "seeds" and (not isinstance(item, str) or not item.strip()):
            raise ConfigError(f"{source} has {_shown(item)} in sweep.{name}; expected {name[:-1]} names such as "
                              + ("digits, emnist" if name == "datasets" else "hasfl, random-budget"))
    check_distinct(value, name, f"{source} has", f"in sweep.{name}")
    return value


def check_distinct(values: List[Any], name: str, before: str, after: str) -> None:
    """One sentence when ``values`` (a sweep's ``seeds``, ``algorithms`` or ``datasets``, from its YAML block or
    its flags) gives an entry twice: each names cells of their own, so a repeat is never merged in silence (two
    seeds asked for, one run and a mean over one)."""
    seen = set()
    for item in values:
        if item in seen:
            example = "42, 43" if name == "seeds" else "digits, emnist" if name == "datasets" else "hasfl, fjord"
            where = f" {after}" if after else ""
            raise ConfigError(f"{before} {name[:-1]} {_shown(item)} twice{where}; expected distinct {name}, each "
                              f"run once (e.g. {example})")
        seen.add(item)


def shared_keys(values: Mapping[str, Any], flags: Mapping[str, Any], source: str, variants: bool = True) -> frozenset:
    """The keys of :func:`single_run_values`' run that a sweep config gives for every dataset it runs (its shared
    keys and its variants'; not the run's ``per_dataset`` keys): a key only some datasets read (``alpha``) is not
    refused where the run's dataset does not (``check_inert_keys``' ``shared``); none for a plain config file.
    ``variants`` false: the shared keys alone, those given for every algorithm (``check_inert_keys``'
    ``shared_options``: a variant's option is its algorithm's own)."""
    block, shared = split_sweep_config(values, source)
    if block is None:
        return frozenset()
    datasets = sweep_list(block.get("datasets"), "datasets", source) or [shared.get("dataset", "digits")]
    own = block["per_dataset"].get(flags.get("dataset") or datasets[0], {})
    given = [keys for keys in block["variants"].values() if isinstance(keys, Mapping)] if variants else []
    return frozenset(k for k in [*shared, *(k for keys in given for k in keys)] if k not in own)


def single_run_values(values: Mapping[str, Any], flags: Dict[str, Any], source: str) -> Dict[str, Any]:
    """The RunConfig keys ``simulate --config`` takes from a config file: a plain one as it is; a sweep config's
    shared keys, then the ``per_dataset`` keys of the dataset run (``--dataset``, else the sweep's first), then the
    keys of the variant ``--algorithm`` names, with the sweep's first algorithm and seed as defaults. An
    ``--algorithm`` flag naming a variant is replaced in ``flags`` by the algorithm the variant runs."""
    block, shared = split_sweep_config(values, source)
    if block is None:
        return shared
    datasets = sweep_list(block.get("datasets"), "datasets", source) or [shared.get("dataset", "digits")]
    algorithms = sweep_list(block.get("algorithms"), "algorithms", source) or [shared.get("algorithm", "hasfl")]
    seeds = sweep_list(block.get("seeds"), "seeds", source) or [shared.get("seed", 42)]
    dataset = flags.get("dataset") or datasets[0]
    algorithm = flags.get("algorithm") or algorithms[0]
    result = {**shared, "dataset": dataset, "seed": seeds[0],
              **block["per_dataset"].get(dataset, {})}
    variant = block["variants"].get(algorithm)
    result.update(variant if variant is not None else {"algorithm": algorithm})
    if variant is not None and flags.get("algorithm") == algorithm:
        flags["algorithm"] = result.get("algorithm", "hasfl")
    return result
