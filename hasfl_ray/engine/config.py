"""The former home of the run configuration, kept importable: every name it held now lives in :mod:`hasfl_ray.config`.

Import from :mod:`hasfl_ray.config` in new code; this module re-exports the same objects (private helpers included),
so ``from hasfl_ray.engine.config import RunConfig`` and the other names it documented keep working."""

from hasfl_ray.config.faults import FAULT_KINDS, fault_inject_round, parse_fault  # noqa: F401
from hasfl_ray.config.layers import merge_layers  # noqa: F401
from hasfl_ray.config.migrate import CONFIG_VERSION, LEGACY_OPTION_KEYS, migrate_config  # noqa: F401
from hasfl_ray.config.routing import check_algorithm_options, option_fields, option_owners, route_options  # noqa: F401
from hasfl_ray.config.runconfig import (DEFAULT_MOMENTUM, EVAL_EVERY, EXECUTION_FIELDS, PROTOCOL_FIELDS,  # noqa: F401
                                        RunConfig, auto_training_modes, default_backend, ray_installed)
from hasfl_ray.config.schema import (FLOAT32_MAX, MAX_LR, MODEL_CHOICES, MODEL_NORMS, _number,  # noqa: F401
                                     _positive_number, _real)
from hasfl_ray.config.strict_yaml import (MAX_ALIAS_EXPANSION, AliasExpansionError, DuplicateKeyError,  # noqa: F401
                                          StrictLoader, _construct_unique_mapping, _yaml_children,
                                          check_alias_expansion, load_yaml_config, strict_yaml_load)
from hasfl_ray.config.sweep_block import (SWEEP_FIELDS, SWEEP_KEY, _shown, single_run_values,  # noqa: F401
                                          split_sweep_config, sweep_list)
