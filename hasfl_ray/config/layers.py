"""Config layers merged into one mapping of keys: a resumed run's config, a config file, flags, later over earlier."""

from __future__ import annotations

from typing import Any, Dict, Mapping, Sequence, Tuple

from hasfl_ray.config.migrate import migrate_config
from hasfl_ray.config.routing import route_options
from hasfl_ray.config.schema import RunConfigFields


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
