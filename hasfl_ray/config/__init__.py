"""The run configuration: RunConfig and its checks, strict YAML reading, options routing, migration, the sweep block.

It sits at the bottom of the package and knows no algorithm or dataset: names are plain strings here, checked and
resolved through :mod:`hasfl_ray.registry` (built-ins and plug-ins alike) by :meth:`RunConfig.resolved`, which the
command line and the Engine call. It also reads config files (:func:`load_yaml_config`), a sweep config's
included: :func:`single_run_values` is the one run ``simulate --config`` takes from it, so a plain run needs no sweep
code (:mod:`hasfl_ray.sweep` plans the cells). One concept a module:

- :mod:`~hasfl_ray.config.schema`: the fields and the checks each value passes on construction;
- :mod:`~hasfl_ray.config.runconfig`: :class:`RunConfig` (resolution, to/from a mapping) and what ``auto`` becomes;
- :mod:`~hasfl_ray.config.routing`: which algorithm's options a flat key names, and their checks;
- :mod:`~hasfl_ray.config.migrate`: stored configs of an earlier ``config_version``;
- :mod:`~hasfl_ray.config.layers`: a resumed config, a config file and flags merged into one mapping;
- :mod:`~hasfl_ray.config.strict_yaml`: config files read strictly;
- :mod:`~hasfl_ray.config.sweep_block`: a sweep config's ``sweep:`` block;
- :mod:`~hasfl_ray.config.faults`: ``--fault-inject`` specs.
- :mod:`~hasfl_ray.config.sparse_mix`: what the server cannot aggregate beside channel sets or masks.
"""

from hasfl_ray.config.faults import FAULT_KINDS, fault_inject_round, parse_fault
from hasfl_ray.config.layers import check_inert_keys, given_keys, merge_layers
from hasfl_ray.config.migrate import CONFIG_VERSION, LEGACY_OPTION_KEYS, migrate_config
from hasfl_ray.config.routing import check_algorithm_options, option_fields, option_owners, route_options
from hasfl_ray.config.runconfig import (DEFAULT_MOMENTUM, EVAL_EVERY, EXECUTION_FIELDS, PROTOCOL_FIELDS, RunConfig,
                                        auto_training_modes, default_backend, ray_installed)
from hasfl_ray.config.schema import FLOAT32_MAX, MAX_LR, MODEL_CHOICES, MODEL_NORMS, RunConfigFields
from hasfl_ray.config.strict_yaml import (MAX_ALIAS_EXPANSION, AliasExpansionError, DuplicateKeyError, StrictLoader,
                                          check_alias_expansion, load_yaml_config, parse_option_assignments,
                                          strict_yaml_load)
from hasfl_ray.config.sweep_block import (SWEEP_FIELDS, SWEEP_KEY, shared_keys, single_run_values,
                                          split_sweep_config, sweep_list)

__all__ = [
    "AliasExpansionError", "CONFIG_VERSION", "DEFAULT_MOMENTUM", "DuplicateKeyError", "EVAL_EVERY", "EXECUTION_FIELDS",
    "FAULT_KINDS", "FLOAT32_MAX", "LEGACY_OPTION_KEYS", "MAX_ALIAS_EXPANSION", "MAX_LR", "MODEL_CHOICES", "MODEL_NORMS",
    "PROTOCOL_FIELDS", "RunConfig", "RunConfigFields", "SWEEP_FIELDS", "SWEEP_KEY", "StrictLoader",
    "auto_training_modes", "check_algorithm_options", "check_alias_expansion", "default_backend",
    "check_inert_keys", "fault_inject_round", "given_keys", "load_yaml_config", "merge_layers", "migrate_config", "option_fields", "option_owners",
    "parse_fault", "parse_option_assignments", "ray_installed", "route_options", "shared_keys", "single_run_values",
    "split_sweep_config", "strict_yaml_load", "sweep_list",
]
