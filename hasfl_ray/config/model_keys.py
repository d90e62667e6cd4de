"""The run configuration's model keys and their checks: which network (``model``), its normalisation and Scaler, and
the sBN statistics pass (docs/models.md)."""

from __future__ import annotations

from hasfl_ray import registry
from hasfl_ray.errors import ConfigError

#: The networks ``model`` may name and their normalisations (hasfl_ray.models.resnet; docs/models.md).
MODEL_CHOICES = ("preresnet18", "resnet18", "preresnet18-1112")
MODEL_NORMS = ("sbn", "bn", "gn", "none")


def check_model_keys(config, bad) -> None:
    """Validate ``config``'s model, model_norm and model_scaler (docs/models.md) and its sBN statistics keys,
    normalising a YAML boolean model_scaler to on/off; ``bad(name, value, expected)`` makes the sentence. The
    dataset's inputs are checked by the Engine once it is loaded."""
    if config.model is not None and config.model not in MODEL_CHOICES and not registry.is_spec(config.model):
        raise bad("model", config.model, f"one of {', '.join(MODEL_CHOICES)}, or a plug-in model FILE.py:Class or "
                                          "MODULE:Class (or unset: the dataset's own model)")
    from hasfl_ray.models.depth_plan import check_sub_model_keys

    check_sub_model_keys(config, bad)
    if isinstance(config.model_scaler, bool):
        object.__setattr__(config, "model_scaler", "on" if config.model_scaler else "off")
    if config.sbn_statistics not in ("shuffled", "in_order", "test_batch"):
        raise bad("sbn_statistics", config.sbn_statistics, "shuffled (HeteroFL's pass over shuffled training "
                                                           "batches), in_order or test_batch (FedRolex's)")
    if not isinstance(config.sbn_batch_size, int) or isinstance(config.sbn_batch_size, bool) or \
            config.sbn_batch_size < 2:
        raise bad("sbn_batch_size", config.sbn_batch_size, "an integer of at least 2 (samples per batch of the "
                                                           "sBN statistics pass; HeteroFL's is 10)")
    if config.sbn_statistics_data not in ("clients", "training_set"):
        raise bad("sbn_statistics_data", config.sbn_statistics_data, "clients (the union of the clients' samples) or "
                                                                     "training_set (HeteroFL's whole training set)")
    if config.sbn_statistics_data == "training_set" and config.sbn_statistics != "shuffled":
        raise ConfigError(f"sbn_statistics_data is 'training_set' but sbn_statistics is {config.sbn_statistics!r}; "
                          "expected training_set only with the shuffled pass (HeteroFL's stats)")
    for name, allowed in (("model_norm", MODEL_NORMS), ("model_scaler", ("on", "off"))):
        value = getattr(config, name)
        if value is None:
            continue
        if value not in allowed:
            raise bad(name, value, f"one of {', '.join(allowed)}")
        if config.model is None:
            raise ConfigError(f"{name} is {value!r} but model is unset; expected it only with model "
                              f"{' or '.join(MODEL_CHOICES)} (the datasets' own models have fixed layers)")
        if config.model not in MODEL_CHOICES:  # a plug-in model (docs/plugins.md#models) has its own layers
            raise ConfigError(f"{name} is {value!r} but model is the plug-in {config.model!r}; expected it only "
                              f"with model {' or '.join(MODEL_CHOICES)}")


__all__ = ["MODEL_CHOICES", "MODEL_NORMS", "check_model_keys"]
