"""What the server cannot aggregate beside channel index sets or parameter masks (``Server._aggregate``): a label
split of the classifier and the common-core estimator. One check for the built-ins' configs (fluid, fiarse, fedgmr:
before anything runs) and for a plug-in's client at dispatch (``engine.participants.check_sparse_task``)."""

from __future__ import annotations

from typing import Any, Optional, Tuple

#: Config key -> the value a run whose clients train channel sets or masks must keep.
SPARSE_PLAIN_KEYS = (("classifier_aggregation", "all"), ("estimator", "masked"))


def sparse_config_conflict(config: Any) -> Optional[Tuple[str, Any, str]]:
    """(key, its value, the value expected) of the first setting of ``config`` the server cannot combine with index
    sets or masks, None when there is none."""
    for key, plain in SPARSE_PLAIN_KEYS:
        if getattr(config, key, plain) != plain:
            return key, getattr(config, key), plain
    return None


def check_sparse_config(config: Any, name: str, what: str) -> None:
    """A built-in that trains ``what`` (channel index sets, parameter masks) refuses, before anything runs, a config
    it cannot run with: depth sub-models (a client trains one shape) and what the server cannot aggregate it with
    (:func:`sparse_config_conflict`): one ConfigError sentence (exit status 2)."""
    from hasfl_ray.errors import ConfigError

    if getattr(config, "sub_model", None) not in (None, "width"):  # a client trains one sub-model shape
        raise ConfigError(f"algorithm {name} trains {what} and sub_model is {config.sub_model!r}; expected "
                          "sub_model width")
    conflict = sparse_config_conflict(config)
    if conflict is not None:
        key, value, plain = conflict
        raise ConfigError(f"algorithm {name} trains {what} and {key} is {value!r}; expected {key} {plain}")
