"""The asynchronous loop's state (:mod:`.asynchronous`): the clients in flight and their event queue, the buffer, the
counters of the metrics line under way and per client, and what a checkpoint keeps of them (the clients in flight
with their trained updates, so a resumed run continues bit for bit)."""

from __future__ import annotations

import dataclasses
import heapq
import math
from collections import Counter
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Tuple

import numpy as np
import torch

from hasfl_ray.aggregation.packed import check_packed, from_plain, to_plain
from hasfl_ray.training.result import ClientResult

#: The counters of the metrics line under way (since the last server update).
COUNTERS = ("bytes_down", "bytes_up", "dispatched", "dropped", "unavailable")
#: An in-flight entry's plain fields, as a checkpoint stores them.
ENTRY_FIELDS = ("client", "dispatch", "version", "width", "start_s", "end_s", "lost", "wake", "bytes_up")


@dataclass
class InFlight:
    """A dispatched client: its dispatch number (its training streams' key), the model version it started from,
    its width, when it started and when its update arrives (or it drops out: ``lost``; or, ``wake``, when a slot
    waiting for anyone to be available dispatches it), its upload's bytes and the backend's handle (None when it
    trains nothing)."""

    client: int
    dispatch: int
    version: int
    width: float
    start_s: float
    end_s: float
    lost: bool = False
    wake: bool = False
    bytes_up: int = 0
    handle: Any = None


def result_to_dict(result: ClientResult) -> Dict[str, Any]:
    """A client's result as plain values a checkpoint holds (torch.load with weights_only)."""
    values = {f.name: getattr(result, f.name) for f in dataclasses.fields(result)}
    values["update"] = {name: to_plain(packed) for name, packed in result.update.items()}  # index sets, masks
    return values


def result_from_dict(values: Dict[str, Any]) -> ClientResult:
    values = dict(values)
    values["update"] = {name: from_plain(packed) for name, packed in values["update"].items()}
    return ClientResult(**values)


class AsyncState:
    """The loop's state (see the module docstring); ``sent`` and ``stale_sum`` are per client (clients.csv)."""

    def __init__(self, clients: int):
        self.version = 0  # server updates applied
        self.dispatches = 0  # clients dispatched (the next one's number)
        self.last_update_s = 0.0  # simulated seconds of the last server update
        self.queue: List[Tuple[float, int]] = []  # (end_s, client) of every client in flight, a heap
        self.in_flight: Dict[int, InFlight] = {}
        self.buffer: List[InFlight] = []  # arrived, not yet applied, in arrival order
        self.bytes_down = self.bytes_up = self.dispatched = self.dropped = self.unavailable = 0
        self.sent = np.zeros(clients, dtype=np.int64)  # updates each client sent (arrived)
        self.stale_sum = np.zeros(clients, dtype=np.float64)  # the staleness of its applied updates, summed

    @classmethod
    def fresh(cls, clients: int) -> "AsyncState":
        return cls(clients)

    def push(self, entry: InFlight) -> None:
        self.in_flight[entry.client] = entry
        heapq.heappush(self.queue, (entry.end_s, entry.client))

    def mean_staleness(self) -> np.ndarray:
        """Each client's mean staleness over its applied updates (NaN: none)."""
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(self.sent > 0, self.stale_sum / np.maximum(self.sent, 1), np.nan)

    def _entry(self, entry: InFlight, backend: Any) -> Dict[str, Any]:
        values = {name: getattr(entry, name) for name in ENTRY_FIELDS}
        values["result"] = None if entry.handle is None else result_to_dict(backend.handle_result(entry.handle))
        return values

    def state_dict(self, backend: Any, versions: Optional[Dict[int, Any]]) -> Dict[str, Any]:
        """The state as plain values: the counters, the clients in flight (in event order) and the buffer, each
        with its trained result, and FedAsync's kept model ``versions``."""
        order = sorted(self.in_flight.values(), key=lambda e: (e.end_s, e.client))
        return {"version": self.version, "dispatches": self.dispatches, "last_update_s": self.last_update_s,
                **{name: getattr(self, name) for name in COUNTERS}, "sent": self.sent.copy(),
                "stale_sum": self.stale_sum.copy(), "in_flight": [self._entry(e, backend) for e in order],
                "buffer": [self._entry(e, backend) for e in self.buffer], "versions": versions}

    @classmethod
    def from_state(cls, state: Dict[str, Any], backend: Any) -> "AsyncState":
        out = cls(len(state["sent"]))
        out.version, out.dispatches = int(state["version"]), int(state["dispatches"])
        out.last_update_s = float(state["last_update_s"])
        for name in COUNTERS:
            setattr(out, name, int(state[name]))
        out.sent = np.asarray(state["sent"], dtype=np.int64).copy()
        out.stale_sum = np.asarray(state["stale_sum"], dtype=np.float64).copy()

        def entry(values: Dict[str, Any]) -> InFlight:
            result = values["result"]
            handle = None if result is None else backend.restore_handle(result_from_dict(result))
            return InFlight(**{name: values[name] for name in ENTRY_FIELDS}, handle=handle)

        for values in state["in_flight"]:
            out.push(entry(values))
        out.buffer = [entry(values) for values in state["buffer"]]
        return out


#: Every key of :meth:`AsyncState.state_dict`.
STATE_KEYS = ("version", "dispatches", "last_update_s", *COUNTERS, "sent", "stale_sum", "in_flight", "buffer",
              "versions")
RESULT_FIELDS = tuple(f.name for f in dataclasses.fields(ClientResult))


def _shown(value: Any) -> str:
    """A value for a sentence: a number in 6 digits, anything else as repr (60 characters at most)."""
    if isinstance(value, float):
        return f"{value:.6g}"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _count(value: Any) -> bool:
    """A whole number >= 0 (not a bool)."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_)) and value >= 0


def _time(value: Any) -> bool:
    """A finite number of simulated seconds >= 0."""
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, (bool, np.bool_)) \
        and math.isfinite(float(value)) and float(value) >= 0


def _array_problem(state: Mapping[str, Any], key: str, clients: int) -> Optional[str]:
    value = state[key]
    if not isinstance(value, np.ndarray) or value.dtype.kind not in ("iu" if key == "sent" else "iuf"):
        return f"its asynchronous state's {key} is not an array of {'counts' if key == 'sent' else 'numbers'}"
    if value.shape != (clients,):
        return f"its asynchronous state's {key} has shape {value.shape} for {clients} clients"
    if not np.isfinite(value).all() or (value < 0).any():
        return f"its asynchronous state's {key} holds a negative or non-finite value"
    return None


def _result_problem(result: Any, client: int, params: Mapping[str, torch.Tensor]) -> Optional[str]:
    """What is wrong with a trained result a checkpoint keeps (its fields, its client, its update's tensors:
    parameters of the model, sliced no wider than them), None when nothing is."""
    if not isinstance(result, Mapping) or set(result) != set(RESULT_FIELDS):
        return "is not a client's result"
    if result["client"] != client:
        return f"is client {_shown(result['client'])}'s result"
    update = result["update"]
    if not isinstance(update, Mapping):
        return "holds no update"
    for name, tensor in update.items():
        reference = params.get(name)
        if reference is not None and isinstance(tensor, Mapping) and "packed_kind" in tensor:  # index set or mask
            try:
                check_packed(name, tuple(reference.shape), from_plain(dict(tensor)))
            except (KeyError, TypeError, ValueError, RuntimeError) as error:
                return f"holds an update of {name!r} that is not an index set or mask of the parameter ({error})"
            continue
        if reference is None or not isinstance(tensor, torch.Tensor) or not tensor.is_floating_point() or \
                tensor.dim() != reference.dim() or any(a > b for a, b in zip(tensor.shape, reference.shape)):
            return f"holds an update of {name!r} that is not a slice of the model's parameter"
    return None


def _entry_problem(values: Any, where: str, arrived: bool, state: Mapping[str, Any], now: float, clients: int,
                   params: Mapping[str, torch.Tensor]) -> Optional[str]:
    """What is wrong with one client in flight (``arrived`` False) or in the buffer (True), None when nothing is: a
    client of the run, a dispatch already made, a model version already made, a width, times in order around the
    clock's ``now``, the result it trained (none when it drops out or waits to be dispatched)."""
    if not isinstance(values, Mapping):
        return f"{where} is a {type(values).__name__}"
    missing = [key for key in (*ENTRY_FIELDS, "result") if key not in values]
    if missing:
        return f"{where} lacks {', '.join(missing)}"
    client, dispatch, version = values["client"], values["dispatch"], values["version"]
    if not _count(client) or client >= clients:
        return f"{where} is client {_shown(client)} of a run of {clients} clients"
    if not _count(dispatch) or dispatch >= state["dispatches"]:
        return f"{where} is dispatch {_shown(dispatch)} of {state['dispatches']} made"
    if not _count(version) or version > state["version"]:
        return f"{where} started from model version {_shown(version)}, after the {state['version']} made"
    for key in ("lost", "wake"):
        if not isinstance(values[key], bool):
            return f"{where}'s {key} is {_shown(values[key])}, not a bool"
    lost, wake = values["lost"], values["wake"]
    width = values["width"]
    if not _time(width) or width > 1 or (width == 0 and not wake):
        return f"{where}'s width is {_shown(width)}, not a width in (0, 1]"
    if not _count(values["bytes_up"]):
        return f"{where}'s bytes_up is {_shown(values['bytes_up'])}, not a count of bytes"
    start, end = values["start_s"], values["end_s"]
    if not _time(start) or start > now:
        return f"{where}'s start_s is {_shown(start)}, not a time between 0 and the clock's now {now:.6g}"
    if not _time(end) or end < start or (end > now if arrived else end < now):
        return (f"{where}'s end_s is {_shown(end)}, not a time "
                + (f"between its start_s {start:.6g} and the clock's now {now:.6g}" if arrived else
                   f"at or after its start_s {start:.6g} and the clock's now {now:.6g}"))
    if arrived and (lost or wake):
        return f"{where} is {'lost' if lost else 'waiting'}, not an arrived update"
    if (lost or wake) != (values["result"] is None):
        return f"{where} {'holds a result, which it cannot have' if lost or wake else 'holds no trained result'}"
    problem = None if values["result"] is None else _result_problem(values["result"], client, params)
    return f"{where}'s result {problem}" if problem else None


def _versions_problem(versions: Any, holders: Counter, params: Mapping[str, torch.Tensor]) -> Optional[str]:
    """FedAsync's kept model versions against the clients holding them (a version a client in flight or in the
    buffer started from, as many holders as there are such clients), each the model's parameters, finite."""
    if not isinstance(versions, Mapping):
        return ("it keeps no model versions, which async_rule 'fedasync' needs for the clients in flight"
                if versions is None else f"its kept model versions are a {type(versions).__name__}")
    kept = {}
    for version, value in versions.items():
        if not isinstance(value, (list, tuple)) or len(value) != 2 or not isinstance(value[0], Mapping):
            return f"its kept model version {_shown(version)} is not (parameters, holders)"
        kept[version] = value[1]
    wrong = next((v for v in sorted(set(kept) | set(holders), key=str) if kept.get(v) != holders.get(v)), None)
    if wrong is not None:
        return (f"its kept model version {_shown(wrong)} has {_shown(kept.get(wrong, 0))} holders but "
                f"{holders.get(wrong, 0)} of its clients in flight started from it")
    for version, (values, _) in versions.items():
        if set(values) != set(params):
            return f"its kept model version {_shown(version)} does not hold the model's parameters"
        for name, tensor in values.items():
            reference = params[name]
            if not isinstance(tensor, torch.Tensor) or tuple(tensor.shape) != tuple(reference.shape) or \
                    not tensor.is_floating_point() or not bool(torch.isfinite(tensor).all()):
                return f"its kept model version {_shown(version)}'s {name!r} is not the model's, finite"
    return None


def state_problem(state: Any, rounds_done: int, now: float, clients: int, concurrency: int, buffer_size: int,
                  fedasync: bool, params: Mapping[str, torch.Tensor]) -> Optional[str]:
    """What is wrong with a checkpoint's asynchronous loop state (:meth:`AsyncState.state_dict`) for this run, as a
    phrase ("its asynchronous state's version is -3 after 8 server updates"), or None. Checked whole, as the
    clock's own fields are (:meth:`hasfl_ray.clock.Clock.state_problem`): every key; the version equal to the
    server updates the history holds; the counters whole numbers; last_update_s a time up to the clock's ``now``;
    per-client arrays one value per client; at most ``concurrency`` distinct clients in flight and fewer than
    ``buffer_size`` updates buffered, each entry a client, dispatch and version of the run with times in order and
    the result it trained; FedAsync's kept versions those its clients started from."""
    if not isinstance(state, Mapping):
        return f"its asynchronous state is a {type(state).__name__}"
    missing = [key for key in STATE_KEYS if key not in state]
    if missing:
        return f"its asynchronous state lacks {', '.join(missing)}"
    if state["version"] != rounds_done or not _count(state["version"]):
        return f"its asynchronous state's version is {_shown(state['version'])} after {rounds_done} server updates"
    for key in ("dispatches", *COUNTERS):
        if not _count(state[key]):
            return f"its asynchronous state's {key} is {_shown(state[key])}, not a count"
    if not _time(state["last_update_s"]) or state["last_update_s"] > now:
        return (f"its asynchronous state's last_update_s is {_shown(state['last_update_s'])}, not a time between 0 "
                f"and the clock's now {now:.6g}")
    for key in ("sent", "stale_sum"):
        problem = _array_problem(state, key, clients)
        if problem:
            return problem
    flying, buffer = state["in_flight"], state["buffer"]
    if not isinstance(flying, (list, tuple)) or not isinstance(buffer, (list, tuple)):
        return "its asynchronous state's in_flight or buffer is not a list"
    if len(flying) > concurrency:
        return f"its asynchronous state holds {len(flying)} clients in flight but concurrency is {concurrency}"
    if len(buffer) >= buffer_size:
        return (f"its asynchronous state's buffer holds {len(buffer)} updates but buffer_size is {buffer_size} (a "
                "full buffer is applied at once)")
    for entries, arrived, name in ((flying, False, "in-flight entry"), (buffer, True, "buffered entry")):
        for k, values in enumerate(entries):
            problem = _entry_problem(values, f"its {name} {k}", arrived, state, now, clients, params)
            if problem:
                return problem
    repeated = [key for key, count in Counter(e["client"] for e in flying).items() if count > 1] or \
        [key for key, count in Counter(e["dispatch"] for e in (*flying, *buffer)).items() if count > 1]
    if repeated:
        return f"its asynchronous state holds client or dispatch {repeated[0]!r} in flight twice"
    if fedasync:
        holders = Counter(e["version"] for e in (*flying, *buffer) if e["result"] is not None)
        return _versions_problem(state["versions"], holders, params)
    return None


__all__ = ["AsyncState", "COUNTERS", "ENTRY_FIELDS", "InFlight", "STATE_KEYS", "result_from_dict",
           "result_to_dict", "state_problem"]
