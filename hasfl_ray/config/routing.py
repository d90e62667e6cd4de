"""The options routing: which algorithm (built-in or plug-in) takes a flat key such as ``mu``; its options checked."""

from __future__ import annotations

import dataclasses
from dataclasses import fields
from typing import Any, Dict, List, Mapping

from hasfl_ray import registry
from hasfl_ray.config.schema import RunConfigFields
from hasfl_ray.errors import ConfigError, expected_one_of


def check_algorithm_options(algorithm: str, options: Mapping[str, Any]) -> Dict[str, Any]:
    """``options`` checked against ``algorithm``'s options dataclass (:func:`hasfl_ray.registry.check_options`):
    the complete options, or one sentence."""
    return registry.check_options("algorithm", algorithm, registry.lookup("algorithm", algorithm).options_class,
                                  options)


def option_fields(algorithm: str) -> Dict[str, Any]:
    """The options ``algorithm`` (a registered name or a plug-in spec) declares, name -> default (empty when it
    declares none); one sentence when there is no such algorithm."""
    options_class = registry.lookup("algorithm", algorithm).options_class
    if options_class is None:
        return {}
    return {f.name: f.default_factory() if f.default is dataclasses.MISSING else f.default
            for f in fields(options_class)}


def option_owners() -> Dict[str, List[str]]:
    """Each built-in algorithm's option name -> the built-ins that declare it (``coverage`` -> hasfl,
    random-budget)."""
    owners: Dict[str, List[str]] = {}
    for name in registry.registered("algorithm"):
        for option in option_fields(name):
            owners.setdefault(option, []).append(name)
    return owners


def route_options(values: Mapping[str, Any], source: str = "config", foreign: str = "refuse") -> Dict[str, Any]:
    """``values`` with every key that is not a RunConfig field but an option of the algorithm (``mu`` with
    fedprox, ``gain`` with a plug-in that declares it) moved into ``algorithm_options``.

    One sentence (ConfigError) for a key given both ways, for an unknown key, and for an option another built-in
    declares but this algorithm does not (``mu`` with hasfl): unless ``foreign="drop"``, which drops it (config
    files shared by the algorithms of a sweep, and stored configs of version 1)."""
    known = {f.name for f in fields(RunConfigFields)}
    flat = [k for k in values if k not in known]
    if not flat:
        return dict(values)
    algorithm = values.get("algorithm", RunConfigFields.algorithm)
    own = option_fields(algorithm) if isinstance(algorithm, str) and algorithm else {}
    given = values.get("algorithm_options")
    options = dict(given) if isinstance(given, Mapping) else {}
    owners = option_owners()
    for key in flat:
        if key in own:
            if key in options:
                raise ConfigError(f"{source} gives {key!r} both as a key ({values[key]!r}) and in algorithm_options "
                                  f"({options[key]!r}); expected it once")
            options[key] = values[key]
        elif key in owners:
            if foreign == "drop":  # still a sound value for the algorithm that takes it: `mu: .inf` is a mistake
                check_algorithm_options(owners[key][0], {key: values[key]})
                continue
            takers = owners[key]
            raise ConfigError(f"{key} is {values[key]!r} but algorithm {algorithm!r} takes no option {key!r}; "
                              f"expected it only with {' or '.join(takers)}"
                              + (f" (the options of {algorithm!r}: {', '.join(own)})" if own else ""))
        else:
            choices = sorted(known | set(own) | set(owners))
            raise ConfigError(f"{source} has unknown key {key!r}; "
                              f"{expected_one_of(key, choices, 'a config key: one of')}")
    out = {k: v for k, v in values.items() if k in known}
    if given is not None and not isinstance(given, Mapping):
        out["algorithm_options"] = given  # RunConfig names the bad value
    elif options or given is not None:
        out["algorithm_options"] = options
    return out
