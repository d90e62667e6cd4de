"""Migration of stored configs: a config.yaml or checkpoint of an earlier ``config_version`` read as the current one."""

from __future__ import annotations

from typing import Any, Dict, Mapping

from hasfl_ray import registry
from hasfl_ray.config.routing import option_fields
from hasfl_ray.config.schema import MODEL_CHOICES, RunConfigFields
from hasfl_ray.errors import ConfigError

#: The version of the config.yaml a run writes (``config_version:``). 1 (no key): every built-in's options as flat keys
#: beside the protocol's (:data:`LEGACY_OPTION_KEYS`); 2: the algorithm's own options only, in ``algorithm_options``
#: (:func:`migrate_config` reads 1 as 2); 3 (2026-11-27): the sources' rules became defaults, so a version-2 config
#: is read with the rules it ran under (:data:`VERSION_2_RULES`); 4 (2026-11-30): ScaleFL on a ResNet builds its
#: source's exit heads, so a version-3 ScaleFL run on a ResNet is read with the heads it ran (:data:`VERSION_3_RULES`).
CONFIG_VERSION = 4

#: The built-in algorithms' options that were RunConfig fields before config_version 2: a config.yaml of version 1
#: holds all of them, whichever algorithm ran. Frozen: the migration reads old files, whatever the options are now.
LEGACY_OPTION_KEYS = ("coverage", "p_min", "gamma", "beta", "t_norm", "epsilon", "mu", "budget", "budget_from",
                      "heterofl_weighting", "fjord_distill_weight", "scaffold_global_lr", "rolex_step")


#: What a config of version <= 2 meant where version 3 changed a default or a name (issue 35): its classes:K was the
#: even rule (now classes-even:K; classes:K is HeteroFL's non_iid), its sBN statistics were taken in order (now
#: shuffled), and FedRolex's window moved +t (now the source's -t).
VERSION_2_RULES = "classes:K -> classes-even:K, sbn_statistics in_order, fedrolex rolex_direction forward"


#: What a config of version 3 meant where version 4 changed a default: ScaleFL's runs on a ResNet built DepthFL's exit
#: heads (the option ``scalefl_exit_head`` did not exist; its default is now the source's ``Classifier``).
VERSION_3_RULES = "scalefl on a ResNet: scalefl_exit_head depthfl"


def _given_options(out: Mapping[str, Any]) -> Any:
    """The stored ``algorithm_options``: absent or null is no option given (the defaults of the version the file
    names, which the rules below restore), so ``{}``; anything else as it is (not a mapping: RunConfig names it)."""
    options = out.get("algorithm_options")
    return {} if options is None else options


def _version_3_rules(out: Dict[str, Any]) -> None:
    options = _given_options(out)
    if (out.get("algorithm") == "scalefl" and out.get("model") in MODEL_CHOICES and isinstance(options, Mapping)
            and "scalefl_exit_head" not in options):
        out["algorithm_options"] = {**options, "scalefl_exit_head": "depthfl"}


def _version_2_rules(out: Dict[str, Any]) -> None:
    partition = out.get("partition")
    if isinstance(partition, str) and partition.strip().startswith("classes:"):
        out["partition"] = "classes-even:" + partition.strip()[len("classes:"):]
    model, dataset = out.get("model"), out.get("dataset")
    plugin = registry.is_spec(model) if isinstance(model, str) else (
        model is None and isinstance(dataset, str) and registry.is_spec(dataset))  # its model may have sBN
    if (model in MODEL_CHOICES or plugin) and out.get("model_norm") in (None, "sbn"):  # a run that had sBN
        out.setdefault("sbn_statistics", "in_order")
    options = _given_options(out)
    if out.get("algorithm") == "fedrolex" and isinstance(options, Mapping) and "rolex_direction" not in options:
        out["algorithm_options"] = {**options, "rolex_direction": "forward"}


def migrate_config(values: Mapping[str, Any], source: str = "stored config") -> Dict[str, Any]:
    """A stored config (a run's config.yaml, a checkpoint's config) of any version, as a mapping of the current
    version's keys, without ``config_version``.

    Version 1 (no ``config_version``) stored every built-in's options as flat keys (:data:`LEGACY_OPTION_KEYS`),
    whichever algorithm ran: those of the run's algorithm move into ``algorithm_options`` (an entry already there
    wins), the others are dropped, since that algorithm never read them. A plug-in's options were always in
    ``algorithm_options``. Versions 1 and 2 are read with the rules they ran under (:data:`VERSION_2_RULES`), and
    versions 1 to 3 with the ScaleFL exit heads they ran (:data:`VERSION_3_RULES`). A version newer than
    :data:`CONFIG_VERSION` is refused in one sentence."""
    version = values.get("config_version", 1)
    if not isinstance(version, int) or isinstance(version, bool) or not 1 <= version <= CONFIG_VERSION:
        newer = isinstance(version, int) and not isinstance(version, bool) and version > CONFIG_VERSION
        raise ConfigError(f"{source} has config_version {version!r}; expected an integer from 1 to {CONFIG_VERSION}"
                          + (" (a newer hasfl-ray wrote it?)" if newer else ""))
    out = {k: v for k, v in values.items() if k != "config_version"}
    if version >= 4:
        return out
    if version == 3:
        _version_3_rules(out)
        return out
    if version == 2:
        _version_2_rules(out)
        _version_3_rules(out)
        return out
    algorithm = values.get("algorithm", RunConfigFields.algorithm)
    own: Dict[str, Any] = {}
    if isinstance(algorithm, str) and algorithm and not registry.is_spec(algorithm):
        try:
            own = option_fields(algorithm)
        except ConfigError:  # an algorithm this version lacks: RunConfig.resolved names it
            own = {}
    for key in LEGACY_OPTION_KEYS:
        out.pop(key, None)
    given = values.get("algorithm_options")
    if given is None or isinstance(given, Mapping):  # anything else is left for RunConfig to name
        out["algorithm_options"] = {**{k: values[k] for k in LEGACY_OPTION_KEYS if k in values and k in own},
                                    **(given or {})}
    _version_2_rules(out)
    _version_3_rules(out)
    return out
