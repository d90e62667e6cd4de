"""hasfl_ray.engine.config, the run configuration's former home, still exports every name it held: the same objects
as hasfl_ray.config (issue 36: the configuration moved to a package of its own)."""

import hasfl_ray
import hasfl_ray.config as config
import hasfl_ray.engine as engine
import hasfl_ray.engine.config as former

#: Every top-level name hasfl_ray/engine/config.py defined before the move (its imports aside).
NAMES = ("DEFAULT_MOMENTUM", "CONFIG_VERSION", "LEGACY_OPTION_KEYS", "EXECUTION_FIELDS", "MODEL_CHOICES", "MODEL_NORMS",
         "EVAL_EVERY", "FLOAT32_MAX", "MAX_LR", "RunConfig", "ray_installed", "default_backend",
         "check_algorithm_options", "option_fields", "option_owners", "route_options", "migrate_config", "merge_layers",
         "auto_training_modes", "PROTOCOL_FIELDS", "DuplicateKeyError", "MAX_ALIAS_EXPANSION", "AliasExpansionError",
         "check_alias_expansion", "StrictLoader", "strict_yaml_load", "load_yaml_config", "SWEEP_KEY", "SWEEP_FIELDS",
         "split_sweep_config", "sweep_list", "single_run_values", "FAULT_KINDS", "parse_fault", "fault_inject_round")
PRIVATE = ("_yaml_children", "_construct_unique_mapping", "_shown", "_real", "_number", "_positive_number")


def test_every_name_of_the_former_module_is_the_new_packages_object():
    for name in NAMES:
        assert getattr(former, name) is getattr(config, name), name
    for name in PRIVATE:
        assert callable(getattr(former, name)), name


def test_run_config_is_one_class_whichever_path_names_it():
    assert former.RunConfig is config.RunConfig is engine.RunConfig is hasfl_ray.RunConfig
    assert config.RunConfig().resolved().to_dict() == former.RunConfig.from_dict({}).resolved().to_dict()
