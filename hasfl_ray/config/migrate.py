"""Migration of stored configs: a config.yaml or checkpoint of an earlier ``config_version`` read as the current one."""

from __future__ import annotations

from typing import Any, Dict, Mapping

from hasfl_ray import registry
from hasfl_ray.config.routing import option_fields
from hasfl_ray.config.schema import RunConfigFields
from hasfl_ray.errors import ConfigError

#: The version of the config.yaml a run writes (``config_version:``). 1 (no key): every built-in's options as flat keys
#: beside the protocol's (:data:`LEGACY_OPTION_KEYS`); 2: the algorithm's own options only, in ``algorithm_options``
#: (:func:`migrate_config` reads 1 as 2).
CONFIG_VERSION = 2

#: The built-in algorithms' options that were RunConfig fields before config_version 2: a config.yaml of version 1
#: holds all of them, whichever algorithm ran. Frozen: the migration reads old files, whatever the options are now.
LEGACY_OPTION_KEYS = ("coverage", "p_min", "gamma", "beta", "t_norm", "epsilon", "mu", "budget", "budget_from",
                      "heterofl_weighting", "fjord_distill_weight", "scaffold_global_lr", "rolex_step")


def migrate_config(values: Mapping[str, Any], source: str = "stored config") -> Dict[str, Any]:
    """A stored config (a run's config.yaml, a checkpoint's config) of any version, as a mapping of the current
    version's keys, without ``config_version``.

    Version 1 (no ``config_version``) stored every built-in's options as flat keys (:data:`LEGACY_OPTION_KEYS`),
    whichever algorithm ran: those of the run's algorithm move into ``algorithm_options`` (an entry already there
    wins), the others are dropped, since that algorithm never read them. A plug-in's options were always in
    ``algorithm_options``. A version newer than :data:`CONFIG_VERSION` is refused in one sentence."""
    version = values.get("config_version", 1)
    if not isinstance(version, int) or isinstance(version, bool) or not 1 <= version <= CONFIG_VERSION:
        raise ConfigError(f"{source} has config_version {version!r}; expected 1 to {CONFIG_VERSION} (a newer "
                          "hasfl-ray wrote it?)")
    out = {k: v for k, v in values.items() if k != "config_version"}
    if version >= 2:
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
    return out
