"""Config layers merged into one mapping of keys: a resumed run's config, a config file, flags, later over earlier."""

from __future__ import annotations

from typing import AbstractSet, Any, Dict, Mapping, Sequence, Tuple

from hasfl_ray.config.migrate import migrate_config
from hasfl_ray.config.routing import route_options
from hasfl_ray.config.schema import RunConfigFields
from hasfl_ray.errors import ConfigError


def merge_layers(layers: Sequence[Tuple[Mapping[str, Any], str]], source: str = "config") -> Dict[str, Any]:
    """One mapping of config keys from ``(values, foreign)`` layers, later over earlier (a resumed run's config, a
    config file, flags): each layer's flat keys are routed (:func:`route_options`) for the algorithm the layers end
    with, and ``algorithm_options`` merge key by key. A layer's ``algorithm_options`` mapping counts only when the
    layer names that algorithm or none (a resumed HAS-FL run's options do not follow ``--algorithm fedprox``)."""
    algorithm = RunConfigFields.algorithm
    for values, _ in layers:
        algorithm = values.get("algorithm", algorithm)
    out: Dict[str, Any] = {}
    options: Dict[str, Any] = {}
    have_options = False
    for values, foreign in layers:
        if "config_version" in values:  # a run's config.yaml given as a config file
            values = migrate_config(values, source)
        given = values.get("algorithm_options")
        if given is not None and not isinstance(given, Mapping):
            return {**out, **values}  # RunConfig names the bad value
        if values.get("algorithm", algorithm) != algorithm:  # another algorithm's options mapping does not follow
            values = {k: v for k, v in values.items() if k != "algorithm_options"}
        routed = route_options({**values, "algorithm": algorithm}, source, foreign)
        if "algorithm" not in values:
            routed.pop("algorithm")
        if "algorithm_options" in routed:
            options.update(routed.pop("algorithm_options"))
            have_options = True
        out.update(routed)
    if have_options:
        out["algorithm_options"] = options
    return out


def given_keys(layers: Sequence[Mapping[str, Any]]) -> Dict[str, Any]:
    """The keys the user gave in ``layers`` (later over earlier), leaving out a run's whole config given as a layer:
    its stored config.yaml (it holds ``config_version``), or that config as ``migrate_config`` or
    ``load_run(path).config`` return it (every field of the schema, defaults and resolved values included): a run
    rerun from its own config gives no key of its own."""
    return {k: v for layer in layers if not _whole_config(layer) for k, v in layer.items()}


def _whole_config(layer: Mapping[str, Any]) -> bool:
    import dataclasses

    return "config_version" in layer or all(f.name in layer for f in dataclasses.fields(RunConfigFields))


def check_inert_keys(explicit: Mapping[str, Any], merged: Mapping[str, Any], source: str = "config",
                     shared: AbstractSet[str] = frozenset(), shared_options: AbstractSet[str] = None) -> None:
    """Refuse, in one sentence, a key the user gave (``explicit``: a config file's, the flags', a sweep cell's keys;
    never a resumed run's stored config nor a default) that the merged config leaves without effect: ``lr_gamma``
    without ``lr_milestones`` (no round multiplies the rate by it) and ``local_epochs`` beside ``local_steps`` (which
    replaces it). Both were accepted and did nothing (battery 5, A146, A237, A261). ``shared``: keys given for
    runs of several datasets at once (a sweep config's shared keys, its variants', ``sweep``'s flags), of which a key
    only some datasets' partitions read (``alpha``) is not refused where this run's does not read it;
    ``shared_options`` (default ``shared``): keys given for runs of several algorithms (a sweep's shared keys and
    flags, not a variant's), of which an algorithm option is not refused where the run's options leave it inert."""
    where = "" if source == "config" else f" ({source})"
    if "alpha" not in shared:
        _check_alpha(explicit, merged, where)
    if explicit.get("lr_gamma") is not None and not merged.get("lr_milestones"):
        raise ConfigError(f"lr_gamma is {explicit['lr_gamma']!r} but lr_milestones is unset{where}, so it does "
                          "nothing; expected it with --lr-milestones (the rounds at which lr is multiplied by it)")
    _check_given_defaults(explicit, merged, where)
    _check_inert_options(explicit, merged, where, shared if shared_options is None else shared_options)
    if explicit.get("local_epochs") is not None and merged.get("local_steps") is not None:
        raise ConfigError(f"local_epochs is {explicit['local_epochs']!r} beside local_steps "
                          f"{merged['local_steps']!r}{where}, which replaces it, so it does nothing; expected one of "
                          "them")


def _check_alpha(explicit: Mapping[str, Any], merged: Mapping[str, Any], where: str) -> None:
    """Refuse an ``alpha`` given where no partition reads it: only ``dirichlet`` and ``balanced-dirichlet``
    (:data:`hasfl_ray.federation.ALPHA_PARTITIONS`) of a built-in image dataset do; ``iid``, ``classes:K``,
    ``shards:S`` and ``flwr:...`` (whose Dirichlet takes its own value) ignore it, and synthetic and shakespeare have
    their own clients. A plug-in dataset may read it itself: never refused there."""
    from hasfl_ray import registry
    from hasfl_ray.federation import ALPHA_PARTITIONS, normalise_partition, parse_partition

    dataset = merged.get("dataset", RunConfigFields.dataset)
    if explicit.get("alpha") is None or not isinstance(dataset, str) or dataset not in registry.registered("dataset"):
        return
    try:
        scheme = parse_partition(merged.get("partition") or RunConfigFields.partition)[0]
    except ConfigError:
        return  # RunConfig names the bad partition
    readers = " or ".join(ALPHA_PARTITIONS)
    if not getattr(registry.lookup("dataset", dataset), "label_partitions", False):
        why, instead = f"dataset {dataset!r} has its own clients", f"an image dataset with partition {readers}"
    elif scheme not in ALPHA_PARTITIONS:
        why = f"partition {normalise_partition(merged.get('partition'))!r} does not read it"
        instead = f"partition {readers}, which read it"
    else:
        return
    raise ConfigError(f"alpha is {explicit['alpha']!r} but {why}{where}; expected alpha unset, or {instead}")


def _check_inert_options(explicit: Mapping[str, Any], merged: Mapping[str, Any], where: str,
                         shared: AbstractSet[str]) -> None:
    """Refuse an algorithm option the user gave (a flat key or flag, or in ``algorithm_options``: a config file's,
    ``--algo-opt``) that the run's other options leave without effect: the options dataclass may declare
    ``inert(config)`` (the merged config keys -> {option: (why, what would make it act)}): ``fjord_distill_weight``
    with ``fjord_kd: false``, ``depthfl_alpha`` with ``depthfl_feddyn: false``, ``scalefl_kd_temperature`` at
    ``scalefl_kd_gamma`` 0, ...
    A key given for runs of several algorithms at once (``shared``: a sweep config's shared keys) is not refused."""
    import dataclasses

    from hasfl_ray import registry
    from hasfl_ray.config.routing import check_algorithm_options, option_fields

    algorithm = merged.get("algorithm", RunConfigFields.algorithm)
    try:
        own = option_fields(algorithm)
        options_class = registry.lookup("algorithm", algorithm).options_class
        routed = route_options(merged, foreign="drop").get("algorithm_options")
        complete = check_algorithm_options(algorithm, routed if isinstance(routed, Mapping) else {})
        options = options_class(**complete) if options_class is not None else None
    except Exception:  # noqa: BLE001 (RunConfig, which ran first, names what is wrong; a plug-in's own errors)
        return
    if options is None or not dataclasses.is_dataclass(options):
        return
    mapping = explicit.get("algorithm_options")
    given = [k for k in explicit if k in own] + (list(mapping) if isinstance(mapping, Mapping) else [])
    hook = getattr(options, "inert", None)
    inert = dict(hook(merged)) if callable(hook) else {}
    for name in given:
        if name in inert and name not in shared:
            why, instead = inert[name]
            raise ConfigError(f"{name} is {complete[name]!r}{where} but {why}, so it does nothing; expected {name} "
                              f"unset, or {instead}")


def _check_given_defaults(explicit: Mapping[str, Any], merged: Mapping[str, Any], where: str) -> None:
    """Refuse by name a value the user gave, the schema's default included, that the run would not honour, where a
    stored config.yaml records that default for the runs that give nothing (so the key cannot become None-until-
    resolved without changing their hash, and only the user's keys are checked, never a stored run's; issue 44): a
    ``partition`` on a dataset with its own clients (``dirichlet`` too), ``aggregation_weights`` other than what a
    built-in always runs with (its ``fixed_config``: DepthFL's, ScaleFL's and FIARSE's count mean), and
    ``aggregation_weights: samples`` beside ``heterofl_weighting: count``."""
    from hasfl_ray import registry  # registered() imports the built-ins

    dataset = merged.get("dataset", RunConfigFields.dataset)
    if explicit.get("partition") is not None and isinstance(dataset, str) and \
            dataset in registry.registered("dataset") and \
            not getattr(registry.lookup("dataset", dataset), "label_partitions", False):  # any other: resolved()'s
        raise ConfigError(f"partition is {explicit['partition']!r} but dataset {dataset!r} has its own clients (no "
                          f"label partition applies to it){where}; expected partition left unset, or an image "
                          "dataset (digits, emnist, cifar10, cifar100)")
    algorithm = merged.get("algorithm", RunConfigFields.algorithm)
    options = merged.get("algorithm_options")
    if algorithm == "heterofl" and explicit.get("aggregation_weights") == "samples" and \
            isinstance(options, Mapping) and options.get("heterofl_weighting") == "count":
        raise ConfigError(f"aggregation_weights is 'samples' but heterofl_weighting is 'count'{where}, which weighs "
                          "each client 1; expected one of them (aggregation_weights count is the same rule)")
    if not isinstance(algorithm, str) or algorithm not in registry.registered("algorithm"):
        return  # a plug-in decides itself (its file is not imported here)
    fixed = getattr(registry.lookup("algorithm", algorithm), "fixed_config", None) or {}
    for key, (value, why) in fixed.items():
        if explicit.get(key) is not None and explicit[key] != value:
            raise ConfigError(f"{key} is {explicit[key]!r} but algorithm {algorithm} always runs with {key} "
                              f"{value} ({why}){where}; expected {value} or {key} left unset")
