"""Sweep planning: the cells of an experiment config, each a (dataset, algorithm, seed) run.

A sweep config is a run config (RunConfig keys: the shared protocol) with a ``sweep:`` block naming the cells::

    sweep:
      reproduces: Table 3 of the paper          # free text, shown in sweep.json and reports
      datasets: [cifar10, emnist]               # or a top-level `dataset:` key for one dataset
      algorithms: [hasfl, fjord, uniform, hasfl-coverage-off]
      seeds: [42, 43, 44]
      per_dataset:                              # RunConfig keys for one dataset, over the shared ones
        cifar10: {local_epochs: 5}
      variants:                                 # extra algorithm names: the RunConfig keys each sets
        hasfl-coverage-off: {algorithm: hasfl, coverage: false}
      out: runs/table3                          # default --out (default: runs/<config file name>)
    rounds: 200                                 # shared protocol: plain RunConfig keys
    ...

A cell's config is: shared keys, then its dataset's ``per_dataset`` keys, then its variant's keys, then the
command-line overrides. Cells are written to ``OUT/<dataset>-<algorithm>-seed<seed>/`` (a normal run directory). A
random-budget cell waits for the HAS-FL cell of its dataset and seed and takes that run's post-warm-up average width
as its budget (``budget_from``). The ``sweep:`` block itself is read by
:func:`hasfl_ray.config.split_sweep_config` (``simulate --config`` takes one run of a sweep config without
this package).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
from dataclasses import asdict, dataclass, field
from typing import Any, Dict, Iterator, List, Mapping, Optional, Sequence

from hasfl_ray.config.sweep_block import check_distinct
from hasfl_ray.config import (RunConfig, check_inert_keys, load_yaml_config, option_fields, option_owners,
                              split_sweep_config, sweep_list)
from hasfl_ray.errors import ConfigError, expected_one_of
from hasfl_ray.registry import folder_label, is_spec, lookup, registered, spec_label
from hasfl_ray.sweep.unused import check_unused_shared

#: Options of a single Ray run that a sweep cell (the local backend inside one Ray task) does not take.
RAY_RUN_ONLY = ("actors", "address", "fault_inject", "gpus_per_actor", "server_placement")
#: Of those and ``backend``, the keys whose place in a sweep is one of its own flags (where its cells' tasks run).
PLACED_BY_FLAGS = ("backend", "address", "gpus_per_actor")
#: Statuses of a finished cell (its dependants may start).
FINISHED = ("done", "resumed", "skipped", "reused")


@dataclass
class Cell:
    """One run of a sweep.

    Attributes:
        name: ``<dataset>-<algorithm>-seed<seed>``, also the run directory's name under the sweep's folder.
        dataset, algorithm, seed: the cell's coordinates (``algorithm`` as the sweep names it: an algorithm or a
            variant).
        dir: the run directory.
        values: the RunConfig keys of the run (unresolved).
        depends_on: the name of the cell that must finish first (random-budget's HAS-FL cell), or None.
        status: pending, running, done, resumed, skipped, reused (copied from a finished run of another sweep
            with the same config), failed, blocked, or interrupted (a signal stopped the sweep; its next run
            resumes the cell from its checkpoint).
        message: why a failed or blocked cell did not finish.
    """

    name: str
    dataset: str
    algorithm: str
    seed: int
    dir: str
    values: Dict[str, Any]
    depends_on: Optional[str] = None
    status: str = "pending"
    message: str = ""

    def to_dict(self) -> Dict[str, Any]:
        return asdict(self)


@dataclass
class Sweep:
    """A planned sweep: its cells in run order and what sweep.json records about it."""

    config_file: str
    out: str
    reproduces: str
    datasets: List[str]
    algorithms: List[str]
    seeds: List[int]
    shared: Dict[str, Any]
    overrides: Dict[str, Any]
    cells: List[Cell] = field(default_factory=list)

    def cell(self, name: str) -> Cell:
        return next(c for c in self.cells if c.name == name)

    def describe(self) -> Dict[str, Any]:
        return {"config": self.config_file, "reproduces": self.reproduces, "out": self.out,
                "datasets": self.datasets, "algorithms": self.algorithms, "seeds": self.seeds,
                "protocol": self.shared, "overrides": self.overrides,
                "cells": [{k: v for k, v in c.to_dict().items() if k != "values"} | {"config": c.values}
                          for c in self.cells]}


def parse_list(text: Optional[str], name: str, integer: bool = False) -> Optional[List[Any]]:
    """``42,43,44`` (commas or spaces) as a list; one sentence when empty or (with ``integer``) not integers."""
    if text is None:
        return None
    items = [item for item in text.replace(",", " ").split() if item]
    if not items:
        raise ConfigError(f"--{name} is {text!r}; expected a comma-separated list such as "
                          + ("42,43,44" if integer else "hasfl,random-budget"))
    if integer:
        try:
            values = [int(item) for item in items]
        except ValueError:
            raise ConfigError(f"--{name} is {text!r}; expected a comma-separated list of non-negative integers "
                              "such as 42,43,44") from None
        if any(v < 0 for v in values):
            raise ConfigError(f"--{name} is {text!r}; expected non-negative integers such as 42,43,44")
        items = values
    check_distinct(items, name, f"--{name} is {text!r}, which gives", "")  # never merged in silence
    return items


def name_problem(name: str) -> Optional[str]:
    """Why ``name`` (a variant's, or a cell's: its run directory's name) cannot be one folder under a sweep's
    ``--out``: a ``/`` (``x/../../..`` or an absolute path would leave it), ``.`` or ``..``, a NUL character, more
    than 255 bytes; None when it can."""
    if "/" in name or (os.altsep and os.altsep in name):
        return "which has a '/' in it (a path, not a name)"
    if name in (".", ".."):
        return "which is a path, not a name"
    if "\0" in name:
        return "which has a NUL character in it"
    if len(name.encode("utf-8", "surrogateescape")) > 255:
        return f"which is {len(name.encode('utf-8', 'surrogateescape'))} bytes long (a folder name has at most 255)"
    return None


def _option(values: Mapping[str, Any], name: str, default: Any = None) -> Any:
    """An algorithm option of a cell's values, given as a flat key or in ``algorithm_options``."""
    options = values.get("algorithm_options")
    if isinstance(options, Mapping) and name in options:
        return options[name]
    return values.get(name, default)


@contextlib.contextmanager
def naming(source: str) -> Iterator[None]:
    """A bad value's sentence from the block it runs (``alpha is -1; expected a number > 0``) says which layer of
    the sweep's file, or which cell, holds it: ``alpha is -1 (config file 's.yaml' sweep variant 'bad'); expected
    ...`` (a league config has 88 variants). A sentence that names it already is left as it is."""
    try:
        yield
    except ConfigError as error:
        text = str(error)
        if source in text:
            raise
        head, sep, tail = text.partition("; expected")
        raise type(error)(f"{head} ({source}){sep}{tail}") from None


def check_layer(values: Mapping[str, Any], source: str, block: Mapping[str, Any]) -> None:
    """Refuse (one sentence) a bad value or an unknown key among a sweep config's shared, variant or per-dataset
    keys, before any cell is planned: RunConfig fields are checked as such; any other key must be an option of an
    algorithm the sweep runs (a plug-in's too) or of a built-in (a flat ``mu`` applies to the fedprox cells, if any:
    a config file is shared, and configs/ list the whole protocol)."""
    known = {f.name for f in dataclasses.fields(RunConfig)}
    fields = {k: v for k, v in values.items() if k in known and k != "algorithm_options"}
    if fields.get("global_width") == "first" and "width_mix" not in fields:  # the variants name the levels: each
        fields.pop("global_width")  # cell's whole config is checked when it is planned
    if "dataset" not in fields:  # the datasets are the sweep's: each cell's pair is checked when it is planned
        fields.pop("input_normalization", None)
    with naming(source):
        RunConfig.from_dict(fields, source, check_options=False)
    variants = block.get("variants") or {}
    names = [variants.get(a, {}).get("algorithm", a) for a in sweep_list(block.get("algorithms"), "algorithms", source)]
    names = names or [values.get("algorithm", RunConfig.algorithm)]
    names += [v.get("algorithm", RunConfig.algorithm) for v in variants.values()]
    # a built-in's option is taken by its cells, if any (a file is shared; configs/ list the whole protocol)
    allowed = known | set(option_owners())
    for name in dict.fromkeys(n for n in names if isinstance(n, str) and n):
        allowed |= set(option_fields(name))
    for key in values:
        if key in allowed:
            continue
        choices = sorted(allowed)
        raise ConfigError(f"{source} has unknown key {key!r}; {expected_one_of(key, choices, 'a config key: one of')}")


def plan_sweep(config_file: str, overrides: Mapping[str, Any], datasets: Optional[Sequence[str]] = None,
               algorithms: Optional[Sequence[str]] = None, seeds: Optional[Sequence[int]] = None,
               out: Optional[str] = None) -> Sweep:
    """The cells of ``config_file`` (a sweep config, or a plain config: one dataset, algorithm and seed), narrowed
    by ``datasets``/``algorithms``/``seeds`` and with ``overrides`` (RunConfig keys) applied to every cell.

    Raises ConfigError (one sentence) for a missing or malformed file, an unknown algorithm, dataset or key, or a
    cell whose config is invalid."""
    DATASETS = registered("dataset")

    if not os.path.isfile(config_file):
        raise ConfigError(f"config file {config_file!r} does not exist; expected a sweep YAML such as "
                          "configs/table3-allocation.yaml")
    source = f"config file {config_file!r}"
    block, shared = split_sweep_config(load_yaml_config(config_file), source)
    block = block or {"per_dataset": {}, "variants": {}}
    check_layer(shared, source, block)  # unknown keys and bad values refused before anything runs
    for name in ("dataset", "algorithm", "seed"):
        if name in overrides:
            raise ValueError(f"override {name!r} belongs in datasets/algorithms/seeds")
    for key in ("actors", "fault_inject", "server_placement"):  # --address and --gpus-per-actor place the cells' tasks instead
        if overrides.get(key) is not None:
            raise ConfigError(f"--{key.replace('_', '-')} is {overrides[key]!r} but sweep cells run the local "
                              "backend, one Ray task per cell; expected no Ray actor options")
    variants = block["variants"]
    for layer in ("variants", "per_dataset"):  # keys every cell sets itself are refused, never dropped
        for name, keys in block[layer].items():
            placing = [k for k in ("backend",) + RAY_RUN_ONLY if k in keys]
            if placing:
                key = placing[0]
                instead = ("sweep's --backend, --address or --gpus-per-actor flags instead" if key in PLACED_BY_FLAGS
                           else "it left out (a cell has no actors to count or place, and no fault to inject)")
                raise ConfigError(f"{source} has {key} {keys[key]!r} in sweep.{layer}.{name}, but every sweep cell "
                                  f"runs the local backend, one Ray task per cell; expected {instead}")
    for name, keys in variants.items():
        problem = name_problem(name)
        if problem:
            raise ConfigError(f"{source} has sweep variant {name!r}, {problem}; expected a plain name such as "
                              "hasfl-coverage-off (it names the variant's run directories under --out)")
        check_layer({**shared, **keys}, f"{source} sweep variant {name!r}", block)
    for name, keys in block["per_dataset"].items():
        if name not in DATASETS:
            raise ConfigError(f"{source} has sweep.per_dataset entry {name!r}; expected a dataset, one of "
                              + ", ".join(DATASETS))
        check_layer({**shared, **keys, "dataset": name}, f"{source} sweep.per_dataset.{name}", block)

    own_datasets = sweep_list(block.get("datasets"), "datasets", source) or [shared.get("dataset", "digits")]
    own_algorithms = sweep_list(block.get("algorithms"), "algorithms", source) or [shared.get("algorithm", "hasfl")]
    datasets, algorithms = list(datasets or own_datasets), list(algorithms or own_algorithms)
    seeds = list(seeds or sweep_list(block.get("seeds"), "seeds", source) or [shared.get("seed", 42)])
    for dataset in datasets:
        if is_spec(dataset):
            lookup("dataset", dataset)  # a plug-in: one sentence for a missing file or class
        elif dataset not in DATASETS:
            raise ConfigError(f"dataset {dataset!r} is not known; {expected_one_of(dataset, DATASETS)}, or a "
                              "plug-in FILE.py:Class / MODULE:Class")
    for algorithm in algorithms:
        if is_spec(algorithm) and algorithm not in variants:
            lookup("algorithm", algorithm)  # a plug-in: one sentence for a missing file or class
        elif algorithm not in registered("algorithm") and algorithm not in variants:
            hint = expected_one_of(algorithm, list(registered("algorithm")) + list(variants))
            plugin = "a plug-in FILE.py:Class / MODULE:Class"
            raise ConfigError(f"algorithm {algorithm!r} is not known; " + (
                f"{hint} (or {plugin})" if hint.endswith("?") else f"{hint}, or {plugin}"))
    for seed in seeds:
        if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
            raise ConfigError(f"{source} has seed {seed!r}; expected non-negative integers such as 42, 43, 44")
    # a shared key no cell uses (the config's own cells and those the flags name): one sentence
    check_unused_shared(shared, block, list(dict.fromkeys([*own_datasets, *datasets])),
                        list(dict.fromkeys([*own_algorithms, *algorithms])), source, overrides,
                        (datasets, algorithms))
    stem = os.path.splitext(os.path.basename(config_file))[0]
    out = out or (block.get("out") or os.path.join("runs", stem)).rstrip("/" + os.sep) + override_suffix(overrides)
    overrides = {k: v for k, v in overrides.items() if k not in ("address", "gpus_per_actor")}
    sweep = Sweep(config_file=config_file, out=out, reproduces=str(block.get("reproduces", "")).strip(),
                  datasets=datasets, algorithms=algorithms, seeds=seeds, shared=shared, overrides=dict(overrides))

    def make(dataset: str, algorithm: str, seed: int) -> Cell:
        values = {**shared, **block["per_dataset"].get(dataset, {}),
                  **variants.get(algorithm, {"algorithm": algorithm}), **overrides,
                  "dataset": dataset, "seed": seed, "backend": "local"}
        if "algorithm_options" in overrides and isinstance(shared.get("algorithm_options"), dict):
            values["algorithm_options"] = {**shared["algorithm_options"], **overrides["algorithm_options"]}
        for key in RAY_RUN_ONLY:
            values.pop(key, None)
        name = f"{folder_label(dataset)}-{spec_label(algorithm)}-seed{seed}"  # a plug-in: its class name
        problem = name_problem(name)
        if problem:  # a run directory under `out`, never beside or above it
            raise ConfigError(f"sweep cell {name!r} (algorithm {algorithm!r}, dataset {dataset!r}), {problem}; "
                              "expected a name that is one folder under --out")
        with naming(f"sweep cell {name}"):  # another algorithm's options: dropped
            RunConfig.from_dict(values, f"sweep cell {name}", foreign="drop")
        # keys given for every dataset (shared, a variant's, the sweep's flags) are not refused where the cell's
        # dataset does not read them (alpha on synthetic); its per_dataset keys are the cell's own
        own = block["per_dataset"].get(dataset, {})
        across = {*shared, *variants.get(algorithm, {}), *overrides} - set(own)
        check_inert_keys(values, values, f"sweep cell {name}", frozenset(across),
                         frozenset({*shared, *overrides} - set(own)))  # a variant's options are its algorithm's
        if values.get("control_variates_dir"):  # cells run at once: each keeps its c_i files in a folder of its own
            values["control_variates_dir"] = os.path.join(values["control_variates_dir"], name)
        return Cell(name=name, dataset=dataset, algorithm=algorithm, seed=seed, dir=os.path.join(out, name),
                    values=values)

    cells = [make(d, a, s) for d in datasets for a in algorithms for s in seeds]
    # random-budget waits for the HAS-FL cell of its dataset and seed (brought along when the sweep lacks it)
    for cell in list(cells):
        if cell.values["algorithm"] != "random-budget" or _option(cell.values, "budget") is not None \
                or _option(cell.values, "budget_from") is not None:
            continue
        coverage = _option(cell.values, "coverage", True)
        partners = [c for c in cells if c.dataset == cell.dataset and c.seed == cell.seed
                    and c.values["algorithm"] == "hasfl" and _option(c.values, "coverage", True) == coverage]
        partners.sort(key=lambda c: c.algorithm != "hasfl")
        if partners:
            partner = partners[0]
        else:
            partner = make(cell.dataset, "hasfl", cell.seed)
            partner.values["coverage"] = coverage
            cells.insert(cells.index(cell), partner)
        cell.depends_on = partner.name
        cell.values["budget_from"] = partner.dir
    names = [c.name for c in cells]
    for name in names:  # two cells in one run directory would overwrite each other's files
        if names.count(name) > 1:
            raise ConfigError(f"{source} gives sweep cell {name!r} twice (datasets {datasets}, algorithms "
                              f"{algorithms}, seeds {seeds}); expected each dataset, algorithm and seed once, and "
                              "algorithms whose cell names differ")
    check_control_variates_dirs(cells)
    sweep.cells = cells
    return sweep


def check_control_variates_dirs(cells: List[Cell]) -> None:
    """Refuse, before any cell starts, a sweep whose cells' control-variates folders (``control_variates_dir``/CELL)
    are, or lie inside, a cell's run directory (``--control-variates-dir`` equal to the sweep's ``--out``, or to a
    cell's folder): each cell would refuse it at its start (simulate's rule), every rerun alike."""
    runs = [(c, os.path.realpath(c.dir)) for c in cells]
    for cell in cells:
        folder = cell.values.get("control_variates_dir")
        if not folder:
            continue
        real = os.path.realpath(folder)
        for other, run in runs:
            if real == run or real.startswith(run.rstrip(os.sep) + os.sep):
                given = os.path.dirname(folder)
                raise ConfigError(f"control_variates_dir {given!r} would keep control variates in the run directory "
                                  f"{other.dir!r}; expected a folder outside every cell's run directory")


def override_suffix(overrides: Mapping[str, Any]) -> str:
    """What a sweep's default folder (the config's ``sweep.out``, else ``runs/<config name>``) adds for flags that
    change its cells' results
    (``--rounds 5``): ``-<8 hex of their sha256>``, so a small try never lands in (or is refused by) the folder of
    the whole sweep; nothing for none, or for flags of how the cells run only (backend, Ray placement, --data-dir: the
    data are compared by content)."""
    from hasfl_ray.config import EXECUTION_FIELDS

    chosen = {k: v for k, v in overrides.items() if k not in EXECUTION_FIELDS and v is not None}
    if not chosen:
        return ""
    text = json.dumps(chosen, sort_keys=True, default=repr, separators=(",", ":"))
    return "-" + hashlib.sha256(text.encode("utf-8")).hexdigest()[:8]
