"""The driver side of an algorithm, checked: what a plug-in raises becomes one sentence, what it returns is validated.

The engine calls an :class:`~hasfl_ray.algorithms.Algorithm` through :class:`GuardedAlgorithm`, which

- turns an exception raised in one of its methods (other than a ConfigError: bad input it found, which keeps its
  own sentence and exit status 2; SystemExit included, so a plug-in cannot end a run without a word) into
  :class:`PluginError`, one sentence naming the algorithm and the method (the engine writes the traceback into
  RUN/log.txt only, never on the terminal);
- checks what the methods return before it reaches the run, inside the same guard (reading a value can run the
  plug-in's code: an ``__iter__`` that raises, a meta tensor): a width in (0, 1] for every participant and no one
  else, a training objective, a window offset that is a non-negative integer, one finite non-negative aggregation
  weight per participant and not all zero, a finite positive server step, one number per client from
  ``h_tilde()`` and in ``p_current`` (clients.csv has a row for every client, never fewer), a state that a
  checkpoint can hold.

Built-in algorithms pass every check; the checks cost microseconds a round. The per-client calls an asynchronous
run makes at every dispatch (``allocate``, ``sub_model``, ``objective``, ``window_offset``, ``channel_sets``,
``client_cost``) skip the checks where the method is a built-in's own (the class and the method defined in
:mod:`hasfl_ray.algorithms`, not replaced on the class or the instance): what they return is converted as a check
would (the same values), not re-validated. A plug-in's methods, a subclass's overrides included, are checked every
call.
"""

from __future__ import annotations

import functools
import math
import numbers
from collections.abc import Mapping
from typing import Any, Callable, Dict, List, Optional, Sequence

import numpy as np

from hasfl_ray.config import FLOAT32_MAX
from hasfl_ray.errors import PluginError, PluginInputError
from hasfl_ray.registry import call_plugin, shown


@functools.lru_cache(maxsize=4)
def _specs_of(model_name: str):
    """The slice descriptions of a run's model (built once per name)."""
    from hasfl_ray.models import build_model

    return build_model(model_name).param_specs()


class GuardedAlgorithm:
    """``algorithm`` with every call the engine makes checked (see the module docstring).

    Args:
        algorithm: the algorithm instance.
        label: how sentences name it (``hasfl``, or a plug-in's class name).
        num_clients: the run's number of clients (the length of ``h_tilde()`` and ``p_current``); None: unchecked.
    """

    def __init__(self, algorithm: Any, label: str, num_clients: Optional[int] = None):
        self.algorithm, self.label, self.num_clients = algorithm, label, num_clients

    def __getattr__(self, name: str) -> Any:  # options, config, ...: read through
        return getattr(self.algorithm, name)

    def _trusted(self, method: str) -> bool:
        """Whether ``method`` is a built-in algorithm's own: the class and the method defined in
        :mod:`hasfl_ray.algorithms` (a plug-in's subclass, or a method replaced on the class or the instance, is
        not), its checks skipped."""
        cls, known = type(self.algorithm), self.__dict__.setdefault("_trust", {})
        own = getattr(cls, method, None)
        if method in getattr(self.algorithm, "__dict__", {}):
            return False
        if method not in known or known[method][0] is not own:  # (once a method; again where the class's changed)
            known[method] = (own, cls.__module__.startswith("hasfl_ray.algorithms.") and
                             getattr(own, "__module__", "").startswith("hasfl_ray.algorithms."))
        return known[method][1]

    def _call(self, method: str, *args: Any, check: Optional[Callable[[Any], Any]] = None,
              expected: str = "") -> Any:
        return call_plugin(f"algorithm {self.label!r}", method, lambda *a: getattr(self.algorithm, method)(*a), *args,
                           check=check, expected=expected)

    def _bad(self, method: str, what: str, value: Any, expected: str, kind: type = PluginError) -> PluginError:
        """The one sentence of a bad return value; ``kind`` PluginInputError (exit status 2) for a sub-model
        description the run cannot use (channel sets, masks, depths: bad input, issue 44)."""
        return kind(f"algorithm {self.label!r} returned {what} {shown(value)} from {method}(); expected {expected}")

    def select(self, round: int, available: Sequence[int], k: int) -> List[int]:
        def check(chosen: Any) -> List[int]:
            try:
                clients = sorted({int(i) for i in chosen
                                  if isinstance(i, numbers.Integral) and not isinstance(i, bool)})
                given = len(chosen)
            except TypeError:
                raise self._bad("select", "", chosen, "a list of client ids") from None
            if not 1 <= len(clients) <= k or given != len(clients) or any(i not in available for i in clients):
                raise self._bad("select", "", chosen, f"1 to {k} distinct client ids of the {len(available)} available")
            return clients

        return self._call("select", round, available, k, check=check, expected="a list of client ids")

    def allocate(self, round: int, participants: Sequence[int]) -> Dict[int, float]:
        def check(widths: Any) -> Dict[int, float]:
            if not isinstance(widths, dict) or set(widths) != set(participants):
                raise self._bad("allocate", "", widths, f"a mapping with a width for each of the {len(participants)} "
                                                        "participants and no other client")
            for client, width in widths.items():
                if not _real(width) or not 0 < float(width) <= 1:
                    raise self._bad("allocate", f"width for client {client}:", width, "a width in (0, 1]")
            return {client: float(width) for client, width in widths.items()}

        return self._call("allocate", round, participants, check=_widths if self._trusted("allocate") else check,
                          expected="a mapping of clients to widths")

    def objective(self, round: int, client: int, width: float) -> Any:
        def check(objective: Any) -> Any:
            from hasfl_ray.training.task import LocalObjective

            if not isinstance(objective, LocalObjective):
                raise self._bad("objective", f"for client {client}:", objective,
                                "a hasfl_ray.LocalObjective (or an instance of a subclass)")
            return objective

        return self._call("objective", round, client, width, check=None if self._trusted("objective") else check,
                          expected="a LocalObjective")

    def sub_model(self, round: int, client: int, width: float) -> Any:
        """(width, depth) the client trains; checked by :func:`~hasfl_ray.engine.participants.sub_models`."""
        if not hasattr(self.algorithm, "sub_model"):  # an object that is no Algorithm subclass (tests' doubles)
            return width, None
        return self._call("sub_model", round, client, width)

    def window_offset(self, round: int, client: int) -> int:
        def check(offset: Any) -> int:
            if not isinstance(offset, numbers.Integral) or isinstance(offset, bool) or offset < 0:
                raise self._bad("window_offset", f"offset for client {client}:", offset, "a non-negative integer")
            return int(offset)

        return self._call("window_offset", round, client, check=int if self._trusted("window_offset") else check,
                          expected="a non-negative integer")

    def channel_sets(self, round: int, client: int, width: float) -> Any:
        def check(sets: Any) -> Any:
            if sets is None:
                return None
            expected = "None or one sorted list of ceil(width x C) channel numbers per channel group"
            if getattr(self.algorithm, "depth_plan", None) is not None:  # as masks beside a depth (packed_masks)
                raise self._bad("channel_sets", f"channel sets for client {client}:", sets,
                                "None with sub_model depth or width_depth (one sub-model shape per client: channel "
                                "sets are of the network without exits)", PluginInputError)
            from hasfl_ray.models.index_slicing import channel_groups, channel_numbers, index_sets
            from hasfl_ray.models.slicing import width_channels

            if isinstance(sets, (dict, str, bytes)):  # its keys (or characters) would be read as the groups
                raise self._bad("channel_sets", f"channel sets for client {client}:", sets,
                                f"{expected} (a {type(sets).__name__} is no list of groups)", PluginInputError)
            try:
                sets = tuple(channel_numbers(group, chosen) for group, chosen in enumerate(sets))
            except TypeError:
                raise self._bad("channel_sets", f"channel sets for client {client}:", sets, expected,
                                PluginInputError) from None
            except ValueError as error:
                raise self._bad("channel_sets", f"channel sets for client {client}:", sets,
                                f"{expected} ({error})", PluginInputError) from None
            specs = _specs_of(self.model_name)
            try:
                index_sets(specs, sets)
                sizes = channel_groups(specs)[1]
            except ValueError as error:
                raise self._bad("channel_sets", f"channel sets for client {client}:", sets,
                                f"{expected} ({error})", PluginInputError) from None
            for group, (chosen, size) in enumerate(zip(sets, sizes)):
                if len(chosen) != width_channels(width, size):
                    raise PluginInputError(  # the sets themselves are not shown: the count says what is wrong
                        f"algorithm {self.label!r} returned channel sets for client {client} from channel_sets() "
                        f"whose group {group} holds {len(chosen)} of {size} channels at width {width:g}; expected "
                        f"{width_channels(width, size)} (ceil(width x C)) a group, or None")
            return sets

        return self._call("channel_sets", round, client, width,
                          check=_sets if self._trusted("channel_sets") else check,
                          expected="None or one list of channel numbers per channel group")

    def parameter_masks(self, round: int, client: int, width: float) -> Any:
        """The client's masks (None, or name -> bool tensor of the parameter's full shape), checked once a round
        and kept for the round (the clock prices them, then the task carries them): a bad one is one sentence,
        exit status 2 (:class:`~hasfl_ray.errors.PluginInputError`)."""
        key = (round, client, float(width))
        memo = self.__dict__.setdefault("_masks", {})
        if key in memo:
            return memo[key]
        if not hasattr(self.algorithm, "parameter_masks"):  # an object that is no Algorithm subclass (tests' doubles)
            return None

        def check(masks: Any) -> Any:
            if masks is None:
                return None
            from hasfl_ray.models.index_slicing import check_masks

            try:
                if not isinstance(masks, Mapping):  # any mapping (a read-only view too) is one
                    raise ValueError(f"it is a {type(masks).__name__}, no mapping of parameter names")
                masks = dict(masks)
                named = [name for name in masks if not isinstance(name, str)]
                if named:
                    raise ValueError(f"its key {named[0]!r} is no parameter name (a str)")
                check_masks(_specs_of(self.model_name), masks)
            except ValueError as error:
                raise PluginInputError(f"algorithm {self.label!r} returned masks for client {client} from "
                                       f"parameter_masks() where {error}; expected None or {{name: "
                                       "torch.bool tensor of its shape}") from None
            return {name: mask.detach().cpu() for name, mask in masks.items()}

        if memo and next(iter(memo))[0] != round:
            memo.clear()
        memo[key] = self._call("parameter_masks", round, client, width, check=check,
                               expected="None or a mapping of parameter names to bool tensors")
        return memo[key]

    def client_cost(self, round: int, client: int, width: float, cost: Any) -> Any:
        """The algorithm's :class:`~hasfl_ray.clock.cost.ClientCost` of ``client`` (device clock runs only): the
        same local steps as ``cost``, non-negative bytes and MACs."""
        from hasfl_ray.clock.cost import ClientCost

        def check(value: Any) -> Any:
            if not isinstance(value, ClientCost) or value.steps != cost.steps or value.bytes_down < 0 or \
                    value.bytes_up < 0 or (value.steps and int(np.min(value.step_macs)) < 0):
                raise self._bad("client_cost", f"for client {client}:", value,
                                f"a ClientCost of {cost.steps} local steps with non-negative bytes and MACs "
                                "(cost.plus(...) of the one given)")
            return value

        return self._call("client_cost", round, client, width, cost,
                          check=None if self._trusted("client_cost") else check, expected="a ClientCost")

    def aggregation_weights(self, participants: Sequence[int]) -> List[float]:
        def check(weights: Any) -> List[float]:
            try:
                values = [float(w) for w in weights]
            except (TypeError, ValueError):
                raise self._bad("aggregation_weights", "", weights, "a list of numbers") from None
            if len(values) != len(participants):
                raise self._bad("aggregation_weights", f"{len(values)} weights:", weights,
                                f"one per participant ({len(participants)})")
            if not all(math.isfinite(w) and w >= 0 for w in values) or not any(values):
                raise self._bad("aggregation_weights", "", weights, "finite non-negative weights, not all zero")
            return values

        return self._call("aggregation_weights", participants, check=check, expected="a list of numbers")

    @property
    def server_lr(self) -> float:
        def check(value: Any) -> float:
            if not _real(value) or not 0 < float(value) <= FLOAT32_MAX:
                raise self._bad("server_lr", "", value, "a finite server step > 0 (at most float32's 3.4e38)")
            return float(value)

        return call_plugin(f"algorithm {self.label!r}", "server_lr", lambda: getattr(self.algorithm, "server_lr", 1.0),
                           check=check, expected="a finite server step > 0")

    def set_capacities(self, round: int, p_max: np.ndarray) -> None:
        self._call("set_capacities", round, p_max.copy())

    def arrived(self, version: int, arrivals: Sequence[Any]) -> None:
        self._call("arrived", version, arrivals)

    def observe(self, round: int, results: Sequence[Any], aggregate: Any) -> None:
        self._call("observe", round, results, aggregate)

    def inspect_updates(self, round: int, global_params: Any, results: Sequence[Any]) -> None:
        self._call("inspect_updates", round, global_params, results)

    def _per_client(self, method: str, value: Any) -> np.ndarray:
        """``value`` as float64 numbers, one per client of the run (what clients.csv writes a column of)."""
        expected = f"one number per client ({self.num_clients}), as a 1-D numpy array"
        try:
            array = np.asarray(value, dtype=np.float64)
        except (TypeError, ValueError):
            raise self._bad(method, "", value, expected) from None
        if array.ndim != 1 or (self.num_clients is not None and len(array) != self.num_clients):
            raise self._bad(method, f"{array.size} values of shape {array.shape}:", value, expected)
        return array

    @property
    def overrides_submodel_for_eval(self) -> bool:
        """Whether the algorithm defines its own ``submodel_for_eval`` (else the nested prefix, read on the server)."""
        own = getattr(type(self.algorithm), "submodel_for_eval", None)
        return own is not None and not getattr(own, "prefix_default", False)

    def submodel_for_eval(self, params: Dict[str, Any], width: float,
                          shapes: Dict[str, Any]) -> Optional[Dict[str, Any]]:
        """The algorithm's width-``width`` sub-model of ``params`` (None: the prefix), checked against ``shapes``."""
        from hasfl_ray.evaluation import check_submodel

        if getattr(self.algorithm, "masked_submodels", False):  # full shapes, masked (FIARSE's): the full network
            shapes = {name: spec.shape for name, spec in _specs_of(self.model_name).items()}

        def check(value: Any) -> Any:
            if value is None:
                return None
            try:
                check_submodel(value, shapes)
            except ValueError as error:
                raise self._bad("submodel_for_eval", f"for width {width:g}", value, str(error)) from None
            return {name: value[name].detach().cpu().float() for name in shapes}

        return self._call("submodel_for_eval", params, width, check=check,
                          expected=f"None or the width-{width:g} parameters")

    def h_tilde(self) -> Optional[np.ndarray]:
        return self._call("h_tilde", check=lambda h: None if h is None else self._per_client("h_tilde", h),
                          expected=f"None or one number per client ({self.num_clients})")

    @property
    def p_current(self) -> np.ndarray:
        """The algorithm's widths per client (clients.csv's p_final), checked like :meth:`h_tilde`."""
        return call_plugin(f"algorithm {self.label!r}", "p_current", lambda: self.algorithm.p_current,
                           check=lambda value: self._per_client("p_current", value),
                           expected=f"one width per client ({self.num_clients})")

    def state_dict(self) -> Dict[str, Any]:
        from hasfl_ray.engine.checkpoint import to_plain

        def check(state: Any) -> Dict[str, Any]:
            if not isinstance(state, dict):
                raise self._bad("state_dict", "", state, "a dict of tensors, numpy arrays and plain values")
            try:
                to_plain(state)
            except TypeError as error:
                raise PluginError(f"algorithm {self.label!r} returned a state from state_dict() that a checkpoint "
                                  f"cannot hold ({error})") from None
            return state

        return self._call("state_dict", check=check, expected="a dict of tensors, numpy arrays and plain values")

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        self._call("load_state_dict", state)


def construct(cls: type, label: str, *args: Any) -> Any:
    """``cls(*args)``, with an exception raised by the plug-in's ``__init__`` as one :class:`PluginError` (before
    the run directory exists, nothing is written for a run that cannot start: -v shows the traceback)."""
    return call_plugin(f"algorithm {label!r}", "__init__", cls, *args, early=True)


def _widths(widths: Dict[int, Any]) -> Dict[int, float]:
    """A built-in's ``allocate``: the widths as floats (what the check returns)."""
    return {client: float(width) for client, width in widths.items()}


def _sets(sets: Any) -> Any:
    """A built-in's ``channel_sets``: None, or tuples of ints (what the check returns)."""
    return None if sets is None else tuple(tuple(int(c) for c in chosen) for chosen in sets)


def _real(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(float(value))


__all__ = ["GuardedAlgorithm", "PluginError", "construct"]
