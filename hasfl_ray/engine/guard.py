"""The driver side of an algorithm, checked: what a plug-in raises becomes one sentence, what it returns is validated.

The engine calls an :class:`~hasfl_ray.algorithms.Algorithm` through :class:`GuardedAlgorithm`, which

- turns an exception raised in one of its methods (other than a ConfigError: bad input it found, which keeps its
  own sentence and exit status 2) into :class:`PluginError`, one sentence naming the algorithm and
  the method (the engine writes the traceback into RUN/log.txt only, never on the terminal);
- checks what the methods return before it reaches the run: a width in (0, 1] for every participant and no one
  else, a window offset that is a non-negative integer, one finite non-negative aggregation weight per participant
  and not all zero, a finite positive server step, a state that a checkpoint can hold.

Built-in algorithms pass every check; the checks cost microseconds a round.
"""

from __future__ import annotations

import logging
import math
import numbers
import traceback
from typing import Any, Dict, List, Sequence

from hasfl_ray.engine.config import FLOAT32_MAX
from hasfl_ray.errors import ConfigError, RunError


class PluginError(RunError):
    """An algorithm's method raised, or returned what the run cannot use (the message is one sentence).

    Attributes:
        remote_traceback: the plug-in's traceback (empty for a bad return value), for RUN/log.txt only.
    """

    def __init__(self, message: str, remote_traceback: str = ""):
        super().__init__(message)
        self.remote_traceback = remote_traceback


class GuardedAlgorithm:
    """``algorithm`` with every call the engine makes checked (see the module docstring).

    Args:
        algorithm: the algorithm instance.
        label: how sentences name it (``hasfl``, or a plug-in's class name).
    """

    def __init__(self, algorithm: Any, label: str):
        self.algorithm, self.label = algorithm, label

    def __getattr__(self, name: str) -> Any:  # p_current, options, config, ...: read through
        return getattr(self.algorithm, name)

    def _call(self, method: str, *args: Any) -> Any:
        try:
            return getattr(self.algorithm, method)(*args)
        except ConfigError:
            raise  # bad input the algorithm found (a budget out of range): already its own sentence, exit 2
        except Exception as error:  # noqa: BLE001 (any failure of the plug-in's own code)
            raise PluginError(f"algorithm {self.label!r} raised {type(error).__name__} in {method}() "
                              f"({_short(error)}); its traceback is in RUN/log.txt",
                              traceback.format_exc()) from None

    def _bad(self, method: str, what: str, value: Any, expected: str) -> PluginError:
        return PluginError(f"algorithm {self.label!r} returned {what} {_shown(value)} from {method}(); expected "
                           f"{expected}")

    def allocate(self, round: int, participants: Sequence[int]) -> Dict[int, float]:
        widths = self._call("allocate", round, participants)
        if not isinstance(widths, dict) or set(widths) != set(participants):
            raise self._bad("allocate", "", widths, f"a mapping with a width for each of the {len(participants)} "
                                                    "participants and no other client")
        for client, width in widths.items():
            if not _real(width) or not 0 < float(width) <= 1:
                raise self._bad("allocate", f"width for client {client}:", width, "a width in (0, 1]")
        return {client: float(width) for client, width in widths.items()}

    def objective(self, round: int, client: int, width: float) -> Any:
        return self._call("objective", round, client, width)

    def window_offset(self, round: int, client: int) -> int:
        offset = self._call("window_offset", round, client)
        if not isinstance(offset, numbers.Integral) or isinstance(offset, bool) or offset < 0:
            raise self._bad("window_offset", f"offset for client {client}:", offset, "a non-negative integer")
        return int(offset)

    def aggregation_weights(self, participants: Sequence[int]) -> List[float]:
        weights = self._call("aggregation_weights", participants)
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

    @property
    def server_lr(self) -> float:
        value = getattr(self.algorithm, "server_lr", 1.0)
        if not _real(value) or not 0 < float(value) <= FLOAT32_MAX:
            raise self._bad("server_lr", "", value, "a finite server step > 0 (at most float32's 3.4e38)")
        return float(value)

    def observe(self, round: int, results: Sequence[Any], aggregate: Any) -> None:
        self._call("observe", round, results, aggregate)

    def h_tilde(self) -> Any:
        return self._call("h_tilde")

    def state_dict(self) -> Dict[str, Any]:
        from hasfl_ray.engine.checkpoint import to_plain

        state = self._call("state_dict")
        if not isinstance(state, dict):
            raise self._bad("state_dict", "", state, "a dict of tensors, numpy arrays and plain values")
        try:
            to_plain(state)
        except TypeError as error:
            raise PluginError(f"algorithm {self.label!r} returned a state from state_dict() that a checkpoint "
                              f"cannot hold ({error})") from None
        return state

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        self._call("load_state_dict", state)


def construct(cls: type, label: str, *args: Any) -> Any:
    """``cls(*args)``, with an exception raised by the plug-in's ``__init__`` as one :class:`PluginError`."""
    try:
        return cls(*args)
    except ConfigError:
        raise  # bad input the algorithm found (a budget out of range): already its own sentence, exit 2
    except Exception as error:  # noqa: BLE001
        # before the run directory exists (nothing is written for a run that cannot start): -v shows the traceback
        logging.getLogger(__name__).info("algorithm %s raised in __init__:\n%s", label, traceback.format_exc())
        raise PluginError(f"algorithm {label!r} raised {type(error).__name__} in __init__() ({_short(error)}); "
                          "run with -v to see its traceback") from None


def _real(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(float(value))


def _short(error: BaseException) -> str:
    text = str(error).strip().splitlines()[0] if str(error).strip() else "no message"
    return text if len(text) <= 80 else text[:77] + "..."


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
