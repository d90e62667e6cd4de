"""A sweep config's shared key that no cell of the config uses: refused in one sentence, as a single run refuses a
key it leaves without effect (:func:`hasfl_ray.config.check_inert_keys`).

A cell exempts keys given for several datasets and algorithms at once (a shared ``alpha`` on a synthetic cell, a
shared ``mu`` on a hasfl cell), so a shared key is checked across the config's own cells instead: an algorithm option
(a flat key or one in ``algorithm_options``) that no cell's algorithm declares, or that every cell declaring it
leaves inert (``fjord_distill_weight`` with ``fjord_kd: false``), and an ``alpha`` that no cell's partition reads, did
nothing in any cell and were accepted. The cells are the config's own (its datasets x algorithms, with its
variants), not those narrowed by ``--datasets``/``--algorithms``: a config lists the whole protocol, and running part
of it keeps working.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, List, Mapping, Sequence, Tuple

from hasfl_ray.config import RunConfig, check_inert_keys, option_fields
from hasfl_ray.errors import ConfigError


def _uses(values: Mapping[str, Any], key: str, value: Any, nested: bool) -> bool:
    """Whether a cell whose config is ``values`` reads ``key`` (``nested``: given inside ``algorithm_options``)."""
    if key != "alpha" or nested:
        try:
            if key not in option_fields(values.get("algorithm", RunConfig.algorithm)):
                return False
        except ConfigError:  # a plug-in that cannot be loaded here: the cell names it when it is planned
            return True
    given = {"algorithm_options": {key: value}} if nested else {key: value}
    try:
        check_inert_keys(given, values, "sweep cell", shared=frozenset(), shared_options=frozenset())
    except ConfigError:
        return False
    return True


def _declares(algorithm: str, key: str) -> bool:
    try:
        return key in option_fields(algorithm)
    except ConfigError:
        return False


def check_unused_shared(shared: Mapping[str, Any], block: Mapping[str, Any], datasets: Sequence[str],
                        algorithms: Sequence[str], source: str, overrides: Mapping[str, Any] = None,
                        running: Tuple[Sequence[str], Sequence[str]] = None) -> None:
    """Refuse (one sentence) a key of ``shared`` (a sweep config's top-level keys) that no cell of the config's
    ``datasets`` x ``algorithms`` (names or ``block``'s variants) uses: an algorithm option, or ``alpha``; likewise a
    ``per_dataset`` entry for a dataset no cell runs, and an algorithm option in one that no cell of its dataset
    uses (a per_dataset ``alpha`` is the cell's own: each cell refuses it); and a flag (``overrides``, given for
    every cell: ``sweep --mu 0.5`` of a hasfl sweep) that no cell ``running`` (its datasets, algorithms) uses."""
    variants: Dict[str, Mapping[str, Any]] = block.get("variants") or {}
    per_dataset: Dict[str, Mapping[str, Any]] = block.get("per_dataset") or {}

    def cells(names: Sequence[str], runs: Sequence[str] = algorithms) -> List[Dict[str, Any]]:
        return [{**shared, **per_dataset.get(d, {}), **variants.get(a, {"algorithm": a}), "dataset": d}
                for d in names for a in runs]

    _check_layer(shared, cells(datasets), source, with_alpha=True)
    if overrides:
        ran = cells(*running) if running else cells(datasets)
        _check_layer(overrides, [{**c, **overrides} for c in ran], "", with_alpha=True)
    for dataset, keys in per_dataset.items():
        if dataset not in datasets:
            raise ConfigError(f"{source} has sweep.per_dataset.{dataset} but no sweep cell runs {dataset} (the "
                              f"cells run {', '.join(datasets)}); expected it removed, or {dataset} in "
                              "sweep.datasets")
        _check_layer(keys, cells([dataset]), f"{source} sweep.per_dataset.{dataset}", with_alpha=False)


def _check_layer(keys: Mapping[str, Any], cells: Sequence[Mapping[str, Any]], source: str, with_alpha: bool) -> None:
    known = {f.name for f in dataclasses.fields(RunConfig)}
    candidates: List[Tuple[str, Any, bool]] = [(k, v, False) for k, v in keys.items()
                                               if (k == "alpha" and with_alpha) or k not in known]
    options = keys.get("algorithm_options")
    if isinstance(options, Mapping):
        candidates += [(k, v, True) for k, v in options.items()]
    for key, value, nested in candidates:
        if any(_uses(values, key, value, nested) for values in cells):
            continue
        runs = list(dict.fromkeys(str(v.get("algorithm", RunConfig.algorithm)) for v in cells))
        takers = [name for name in runs if _declares(name, key)]
        shown = f"algorithm_options.{key}" if nested else key
        if key == "alpha" and not nested:
            reason = "no cell's dataset and partition read it"
        elif takers:
            reason = f"the cells of {', '.join(takers)} leave it without effect"
        else:
            reason = f"no cell runs an algorithm that takes it (the cells run {', '.join(runs)})"
        if not source:  # a flag
            flag = "--algo-opt" if nested else f"--{'no-' if value is False else ''}{key.replace('_', '-')}"
            raise ConfigError(f"{key} is {value!r} (given by {flag}) but no sweep cell uses it: {reason}; expected it "
                              "left out, or a cell that uses it")
        raise ConfigError(f"{source} has {shown} {value!r} but no sweep cell uses it: {reason}; expected it "
                          "removed, or a cell that uses it")
