"""The Ray backend's asynchronous clients (docs/async.md): each dispatched client goes, as its own call, to the
trainer with the fewest calls in flight, training from the global model of its dispatch (an object-store object every
trainer reads once); its result stays in the object store until its update arrives in simulated time, when the
server actor applies the arrived ones in arrival order. Where a client trains never changes what it returns."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence

import ray
from ray.exceptions import RayActorError, RayTaskError

from hasfl_ray.engine.backend import trainer_error
from hasfl_ray.engine.server import NonFiniteModelError
from hasfl_ray.errors import ConfigError
from hasfl_ray.simulation.wire import pack, unpack
from hasfl_ray.training.result import ClientResult
from hasfl_ray.training.task import ClientTask


@dataclass
class AsyncHandle:
    """A dispatched client: its task, the trainer slot and generation it went to, and its two returns (the small
    report; the result, one packed object for the server). ``report`` is None for a restored client."""

    task: Optional[ClientTask]
    slot: int
    generation: int
    report: Any
    result: Any


class AsyncTransport:
    """Mixed into :class:`~hasfl_ray.simulation.backend.RayBackend`: the asynchronous primitives of
    :class:`~hasfl_ray.engine.backend.Backend` on the trainer and server actors."""

    def dispatch(self, task: ClientTask) -> AsyncHandle:
        if self._params_ref is None:
            self._params_ref = self.server.params.remote()
        slot = min(self.slots, key=lambda s: (s.in_flight, s.index))
        report, result = slot.actor.run.options(num_returns=2).remote([self._params_ref], [([task], False)])
        slot.in_flight += 1
        return AsyncHandle(task, slot.index, slot.generation, report, result)

    def _arrived(self, handle: AsyncHandle) -> None:
        """Wait for the client's training; a trainer's error in one sentence, a lost trainer as the run's loss."""
        if handle.report is None:
            return
        slot = self.slots[handle.slot]
        try:
            report = ray.get(handle.report)
        except RayActorError as error:
            from hasfl_ray.simulation.transport import _lost
            raise _lost(f"client {handle.task.client} lost its trainer actor", error) from None
        except RayTaskError as error:
            cause = error.as_instanceof_cause()
            if isinstance(cause, ConfigError):
                raise cause from None
            raise trainer_error([handle.task], getattr(error, "cause", None) or error, str(error)) from None
        if handle.generation == slot.generation:
            slot.in_flight -= 1
        self.total_train_seconds += report.train_seconds
        handle.report = None

    def apply_arrivals(self, handles: Sequence[AsyncHandle], weights: Sequence[float], server_lr: float,
                       bases: Optional[Sequence[Optional[int]]] = None):
        for handle in handles:
            self._arrived(handle)
        summary, params = self.server.arrivals.options(num_returns=2).remote(
            list(weights), server_lr, None if bases is None else list(bases), *[h.result for h in handles])
        self._params_ref = params
        try:
            accepted, aggregate, self._frozen, self._frozen_layers = unpack(self._from_server(summary))
        except NonFiniteModelError as error:
            self._params_ref = None
            raise NonFiniteModelError(str(getattr(error, "cause", error))) from None
        return accepted, aggregate

    def handle_result(self, handle: AsyncHandle) -> ClientResult:
        self._arrived(handle)
        return unpack(ray.get(handle.result))[0]

    def restore_handle(self, result: ClientResult) -> AsyncHandle:
        return AsyncHandle(None, 0, 0, None, ray.put(pack((result,))))

    def keep_version(self, version: int) -> None:
        self.server.keep_version.remote(version)  # in order before any later call to the server

    def release_version(self, version: int) -> None:
        self.server.release_version.remote(version)

    def kept_versions(self) -> Dict[int, Any]:
        return unpack(self._from_server(self.server.kept_versions.remote()))

    def restore_versions(self, versions: Mapping[int, Any]) -> None:
        self._from_server(self.server.restore_versions.remote(pack(dict(versions))))


__all__ = ["AsyncHandle", "AsyncTransport"]
