"""Plug-in registries: algorithm and dataset names, and ``path.py:Class`` / ``module:Class`` specs, to classes.

This module sits at the bottom of the package beside the run configuration: it imports nothing of hasfl_ray but its
errors and the careful file checks (:mod:`hasfl_ray.files`, which imports only the errors). Built-ins register themselves with :func:`register_algorithm` / :func:`register_dataset` in their own file;
their packages (:data:`BUILTIN_PACKAGES`, like an entry-point group) are imported on the first look-up, so nothing
here depends on an algorithm or a dataset. A user's plug-in is a class named on the command line or in a YAML config
(``examples/loss_policy.py:LossPolicy``, ``my_package.module:LossPolicy``) or passed to :func:`hasfl_ray.simulate`.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import logging
import math
import os
import sys
import traceback
import typing
from types import ModuleType
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

from hasfl_ray.errors import ConfigError, PluginError, expected_one_of
from hasfl_ray.files import check_regular

#: What a plug-in of each kind subclasses ("module:Class") and the package whose import registers the built-ins.
BASE_CLASSES = {"algorithm": "hasfl_ray.algorithms.base:Algorithm", "dataset": "hasfl_ray.data.base:Dataset"}
BUILTIN_PACKAGES = {"algorithm": "hasfl_ray.algorithms", "dataset": "hasfl_ray.data"}
#: Spec prefixes read by hasfl_ray itself rather than imported as MODULE:Class: prefix -> the "module:function" that
#: makes the plug-in class of such a spec (``--dataset hf:PATH_OR_NAME``, a Hugging Face dataset, docs/datasets.md).
SPEC_PREFIXES = {"dataset": {"hf:": "hasfl_ray.data.hub:hub_dataset_class"}}
#: The largest magnitude a real-valued config key or option may take: training runs in float32, where anything
#: larger is infinity.
FLOAT32_MAX = 3.4028234663852886e38
#: The largest learning rate (``lr``, ``scaffold_global_lr``): a step lr * gradient beyond it overflows float32 weights
#: for any but tiny gradients, and no protocol comes near it (the paper's largest is 0.1).
MAX_LR = 1e3

_REGISTERED: Dict[str, Dict[str, type]] = {"algorithm": {}, "dataset": {}}
_SPECS: Dict[str, Dict[str, type]] = {"algorithm": {}, "dataset": {}}  # spec -> class, for specs loaded or given
#: Modules loaded from a file by path (Ray ships their classes by value: workers cannot import them by name).
FILE_MODULES: List[ModuleType] = []


def finite_number(value: Any) -> bool:
    """A real number (not a bool) that is finite and within float32's range (NaN, infinity and 1e39 are not): the
    rule of every real-valued config key and option."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return False
    try:
        return math.isfinite(value) and abs(value) <= FLOAT32_MAX
    except OverflowError:  # an int too large for a float
        return False


def _register(kind: str, name: str) -> Callable[[type], type]:
    def decorate(cls: type) -> type:
        taken = _REGISTERED[kind].get(name)
        if taken is not None and taken is not cls and (taken.__module__, taken.__qualname__) != \
                (cls.__module__, cls.__qualname__):
            raise ValueError(f"{kind} {name!r} is already registered by {taken.__module__}.{taken.__qualname__}")
        cls.name = name
        _REGISTERED[kind][name] = cls
        return cls
    return decorate


def register_algorithm(name: str) -> Callable[[type], type]:
    """Class decorator: make an :class:`~hasfl_ray.algorithms.base.Algorithm` subclass ``--algorithm NAME``."""
    return _register("algorithm", name)


def register_dataset(name: str) -> Callable[[type], type]:
    """Class decorator: make a :class:`~hasfl_ray.data.base.Dataset` subclass ``--dataset NAME``."""
    return _register("dataset", name)


def _import_attribute(path: str) -> Any:
    module, _, attribute = path.partition(":")
    return getattr(importlib.import_module(module), attribute)


def registered(kind: str) -> Tuple[str, ...]:
    """The names registered for ``kind`` (``algorithm`` or ``dataset``), built-ins first, in registration order."""
    importlib.import_module(BUILTIN_PACKAGES[kind])
    return tuple(_REGISTERED[kind])


def is_spec(name: Any) -> bool:
    """Whether ``name`` names a plug-in class (``path.py:Class`` or ``module:Class``) rather than a registered name."""
    return isinstance(name, str) and ":" in name


def spec_label(name: str) -> str:
    """A short name for run directories and progress bars: the class of a spec, else the name itself."""
    return name.rpartition(":")[2] if is_spec(name) else name


def folder_label(name: str) -> str:
    """:func:`spec_label` as one folder name, for run directories and sweep cells: an ``hf:`` spec's is the last
    part of its location, its column choices dropped (``hf:/data/ds?image=img`` and ``hf:owner/ds``: ``ds``), where
    its location (a path, a hub name with an owner) made the folder a path of several (or, absolute, a folder
    outside ``runs/``)."""
    if isinstance(name, str) and name.startswith("hf:"):
        location = name[len("hf:"):].partition("?")[0].rstrip("/" + os.sep)
        return os.path.basename(location.replace(os.sep, "/").rstrip("/")) or "hf"
    return spec_label(name)


def _load_module(kind: str, spec: str, location: str) -> ModuleType:
    if location.endswith(".py") or os.sep in location or "/" in location:
        path = os.path.abspath(location)
        check_regular(location, f"{kind} {spec!r}: its file")  # a FIFO is refused, never imported (blocking)
        if not os.path.isfile(path):
            raise ConfigError(f"{kind} is {spec!r} but the file {location!r} does not exist; expected FILE.py:Class "
                              "naming a Python file")
        module_name = "hasfl_ray_plugin_" + "".join(c if c.isalnum() else "_" for c in path)
        if module_name in sys.modules:
            return sys.modules[module_name]
        loader_spec = importlib.util.spec_from_file_location(module_name, path)
        module = importlib.util.module_from_spec(loader_spec)
        sys.modules[module_name] = module  # dataclasses and pickling look classes up by their module
        try:
            loader_spec.loader.exec_module(module)
        except BaseException as error:  # SystemExit too: a plug-in's import cannot end the run without a word
            del sys.modules[module_name]
            if isinstance(error, KeyboardInterrupt):
                raise
            raise ConfigError(f"{kind} is {spec!r} but {location!r} fails to import ({type(error).__name__}: "
                              f"{_message(error, 160)}); expected a Python file that imports") from None
        FILE_MODULES.append(module)
        return module
    try:
        try:
            return importlib.import_module(location)
        except ModuleNotFoundError as error:
            # like `python -m`, look in the current directory too (the console script's path holds only its own)
            if not (error.name and location.startswith(error.name)) or os.getcwd() in sys.path or "" in sys.path:
                raise
            sys.path.append(os.getcwd())
            return importlib.import_module(location)
    except ModuleNotFoundError as error:
        if error.name and location.startswith(error.name):
            raise ConfigError(f"{kind} is {spec!r} but no module {location!r} can be imported; expected "
                              "MODULE:Class with MODULE on the Python path, or FILE.py:Class") from None
        raise ConfigError(f"{kind} is {spec!r} but module {location!r} fails to import (ModuleNotFoundError: "
                          f"{error}); expected a module that imports") from None
    except KeyboardInterrupt:
        raise
    except BaseException as error:  # SystemExit too (see above)
        raise ConfigError(f"{kind} is {spec!r} but module {location!r} fails to import ({type(error).__name__}: "
                          f"{_message(error, 160)}); expected a module that imports") from None


def _message(error: BaseException, limit: int = 80) -> str:
    """The first line of ``error``'s message, at most ``limit`` characters (``exit code N`` for a SystemExit; never
    an exception of its own, whatever the plug-in's exception does in ``__str__``)."""
    if isinstance(error, SystemExit):
        return f"exit code {error.code!r}"[:limit]
    try:
        text = " ".join(str(error).split())
    except Exception:  # noqa: BLE001 (a plug-in's exception whose __str__ raises)
        text = ""
    text = text or "no message"
    return text if len(text) <= limit else text[:limit - 3] + "..."


def shown(value: Any, limit: int = 60) -> str:
    """``repr(value)`` on one line, cut to ``limit`` characters, for a sentence (the type's name where repr itself
    raises)."""
    try:
        text = " ".join(repr(value).split())
    except Exception:  # noqa: BLE001 (a plug-in's odd return value)
        text = f"a {type(value).__name__} object"
    return text if len(text) <= limit else text[:limit - 3] + "..."


def call_plugin(owner: str, method: str, function: Callable[..., Any], *args: Any,
                check: Optional[Callable[[Any], Any]] = None, expected: str = "", early: bool = False) -> Any:
    """``function(*args)``, a method of the plug-in ``owner`` (``"algorithm 'X'"``, ``"dataset 'D'"``), and
    ``check`` of what it returns, both contained: whatever either raises (SystemExit and GeneratorExit included)
    becomes one :class:`PluginError` sentence naming the plug-in and the method. A :class:`ConfigError` the method
    raises keeps its own sentence (bad input it found: a data file, a budget); a KeyboardInterrupt (the user's
    second Ctrl-C) and ``check``'s own PluginError go through. ``expected`` ends the sentence of a return value that
    ``check`` could not even read (a meta tensor, an ``__iter__`` that raises).

    The traceback goes into RUN/log.txt (carried by the error, which the engine writes there) or, ``early``
    (before the run directory exists: nothing is written for a run that cannot start), into the log at INFO
    level, shown with -v.
    """
    try:
        value = function(*args)
    except (KeyboardInterrupt, ConfigError):
        raise
    except BaseException as error:  # noqa: BLE001 (any failure of the plug-in's own code)
        raise _plugin_failure(f"{owner} raised {type(error).__name__} in {method}() ({_message(error)})",
                              early) from None
    if check is None:
        return value
    try:
        return check(value)
    except (KeyboardInterrupt, PluginError):
        raise
    except BaseException as error:  # noqa: BLE001 (reading the value ran the plug-in's code: __iter__, __float__)
        raise _plugin_failure(f"{owner} returned {shown(value)} from {method}(), which raised "
                              f"{type(error).__name__} when read ({_message(error)}); expected {expected}", early,
                              hint=False) from None


def _plugin_failure(text: str, early: bool, hint: bool = True) -> PluginError:
    """The PluginError of :func:`call_plugin`, called in its ``except`` block (the traceback is the current one)."""
    trace = traceback.format_exc()
    if early:
        logging.getLogger(__name__).info("%s:\n%s", text, trace)
        return PluginError(text + ("; run with -v to see its traceback" if hint else ""))
    return PluginError(text + ("; its traceback is in RUN/log.txt" if hint else ""), trace)


def _load_spec(kind: str, spec: str) -> type:
    location, _, class_name = spec.rpartition(":")
    if not location or not class_name.isidentifier():
        raise ConfigError(f"{kind} is {spec!r}; expected FILE.py:Class or MODULE:Class naming a plug-in class")
    module = _load_module(kind, spec, location)
    cls = getattr(module, class_name, None)
    if cls is None:
        classes = sorted(n for n, v in vars(module).items() if isinstance(v, type) and v.__module__ == module.__name__)
        raise ConfigError(f"{kind} is {spec!r} but {location!r} has no class {class_name!r}; "
                          + (expected_one_of(class_name, classes, "a class defined there: one of") if 0 < len(classes) <= 12
                             else f"expected one of the {len(classes)} classes defined there, e.g. "
                             f"{', '.join(classes[:4])}" if classes else
                             f"expected a class defined there, and {location!r} defines none"))
    check_subclass(kind, spec, cls)
    return cls


def check_subclass(kind: str, spec: str, cls: Any) -> None:
    """Refuse, in one sentence, a plug-in that is not a subclass of its kind's base class."""
    base = _import_attribute(BASE_CLASSES[kind])
    if cls is base:  # the base class names no method of its own: not "not a subclass", but not a plug-in either
        raise ConfigError(f"{kind} is {spec!r}, the base class hasfl_ray.{base.__name__} itself; expected a class "
                          "that subclasses it")
    if not (isinstance(cls, type) and issubclass(cls, base)):
        what = cls.__name__ if isinstance(cls, type) else type(cls).__name__ + " object"
        raise ConfigError(f"{kind} is {spec!r} but {what} is not a subclass of hasfl_ray.{base.__name__}; expected "
                          f"a class that subclasses hasfl_ray.{base.__name__}")


def lookup(kind: str, name: Any) -> type:
    """The class of a registered ``name`` or a plug-in spec; one sentence (ConfigError) when there is none."""
    if not isinstance(name, str) or not name:
        raise ConfigError(f"{kind} is {name!r}; expected a registered name or FILE.py:Class / MODULE:Class")
    if is_spec(name):
        prefix = next((p for p in SPEC_PREFIXES.get(kind, {}) if name.startswith(p)), None)
        if name not in _SPECS[kind] and prefix is not None:  # a reader of hasfl_ray's own (hf:PATH_OR_NAME)
            _SPECS[kind][name] = _import_attribute(SPEC_PREFIXES[kind][prefix])(name)
        if name not in _SPECS[kind]:
            _SPECS[kind][name] = _load_spec(kind, name)
        return _SPECS[kind][name]
    names = registered(kind)
    if name not in _REGISTERED[kind]:
        hint, plugin = expected_one_of(name, names), ", or a plug-in FILE.py:Class or MODULE:Class"
        hint = hint[:-1] + plugin + ")" if hint.endswith(")") else hint + plugin
        raise ConfigError(f"{kind} is {name!r}; {hint}")
    return _REGISTERED[kind][name]


def spec_of(kind: str, cls: type) -> str:
    """The name to record for a plug-in class passed as an object: its registered name, else ``module:Class``
    (the class is remembered, so the name resolves in this process even where the module cannot be imported)."""
    check_subclass(kind, f"{getattr(cls, '__module__', '?')}:{getattr(cls, '__qualname__', cls)}", cls)
    name = getattr(cls, "name", None)
    if isinstance(name, str) and _REGISTERED[kind].get(name) is cls:
        return name
    for spec, known in _SPECS[kind].items():
        if known is cls:
            return spec
    spec = f"{cls.__module__}:{cls.__qualname__}"
    _SPECS[kind][spec] = cls
    return spec


# ---- options of a plug-in (its own dataclass) ----------------------------------------------------------------

def _expected(kind: Any) -> Optional[str]:
    if kind is bool:
        return "true or false"
    if kind is int:
        return "an integer"
    if kind is float:
        return "a number"
    if kind is str:
        return "a string"
    return None


def _field_type(options_class: type, field: dataclasses.Field) -> Any:
    hints = typing.get_type_hints(options_class)
    kind = hints.get(field.name, field.type)
    if typing.get_origin(kind) is typing.Union:  # Optional[X]
        args = [a for a in typing.get_args(kind) if a is not type(None)]
        kind = args[0] if len(args) == 1 else kind
    return kind


def check_options(kind: str, name: str, options_class: Optional[type], values: Any) -> Dict[str, Any]:
    """``values`` (from ``algorithm_options:`` or ``--algo-opt``) checked against the plug-in's options dataclass:
    unknown keys get a did-you-mean, each value its field's type; returns the complete options, defaults filled."""
    if not isinstance(values, Mapping):
        raise ConfigError(f"{kind}_options is {values!r}; expected a mapping of option names to values")
    if options_class is None:
        if values:
            first = sorted(values)[0]
            raise ConfigError(f"{kind}_options has {first!r} but {kind} {name!r} takes no options; expected none")
        return {}
    known = [f.name for f in dataclasses.fields(options_class)]
    for key in values:
        if key not in known:
            raise ConfigError(f"{kind} option {key!r} is unknown to {name!r}; "
                              f"{expected_one_of(str(key), known, 'an option: one of')}")
    out: Dict[str, Any] = {}
    for field in dataclasses.fields(options_class):
        if field.name not in values:
            continue
        value, kind_ = values[field.name], _field_type(options_class, field)
        given = value
        if kind_ is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value) if abs(value) <= FLOAT32_MAX else math.inf  # too large for float32 anyway
        expected = _expected(kind_)
        if expected is not None and value is not None and \
                (not isinstance(value, kind_) or (kind_ is not bool and isinstance(value, bool))):
            choices = field.metadata.get("choices")  # an option of named values says which (its dataclass field)
            expected += f": one of {', '.join(map(str, choices))}" if choices else ""
            raise ConfigError(f"{field.name} is {value!r}; expected {expected}")
        out[field.name] = value
    # the dataclass's own __post_init__ checks ranges (ConfigError) first; anything else it raises is one sentence
    instance = call_plugin(f"{kind} {spec_label(name)!r}", "options", lambda: options_class(**out), early=True)
    for field in dataclasses.fields(options_class):
        value = out.get(field.name)
        if _field_type(options_class, field) is float and value is not None and not finite_number(value):
            given = values[field.name]
            shown = repr(given) if len(repr(given)) <= 40 else f"{repr(given)[:20]}... ({len(repr(given))} digits)"
            raise ConfigError(f"{kind} option {field.name!r} is {shown}; expected a finite number (not NaN or "
                              "infinity; at most 3.4e+38 in size, float32's largest)")
    return dataclasses.asdict(instance)


__all__ = ["BASE_CLASSES", "BUILTIN_PACKAGES", "FILE_MODULES", "call_plugin", "check_options", "check_subclass",
           "is_spec", "lookup", "register_algorithm", "register_dataset", "registered",
           "folder_label", "shown", "spec_label", "spec_of"]
