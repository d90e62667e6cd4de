"""The asynchronous loop's state (:mod:`.asynchronous`): the clients in flight and their event queue, the buffer, the
counters of the metrics line under way and per client, and what a checkpoint keeps of them (the clients in flight
with their trained updates, so a resumed run continues bit for bit)."""

from __future__ import annotations

import dataclasses
import heapq
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

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
    return {f.name: getattr(result, f.name) for f in dataclasses.fields(result)}


def result_from_dict(values: Dict[str, Any]) -> ClientResult:
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


__all__ = ["AsyncState", "COUNTERS", "ENTRY_FIELDS", "InFlight", "result_from_dict", "result_to_dict"]
