"""The Ray backend's asynchronous clients (docs/async.md): each dispatched client goes, as its own call, to the
trainer with the fewest calls in flight, training from the global model of its dispatch (an object-store object every
trainer reads once); its result stays in the object store until its update arrives in simulated time, when the
server actor applies the arrived ones in arrival order. Where a client trains never changes what it returns: a client
whose trainer died is trained again, on a new trainer, from the same model and task (the handle keeps a reference to
that model until the client's training is known to have ended), so the run ends with the bits it would have had."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Mapping, Optional, Sequence

import ray
from ray.exceptions import RayActorError, RayTaskError

from hasfl_ray.engine.backend import trainer_error
from hasfl_ray.engine.server import NonFiniteModelError
from hasfl_ray.errors import ConfigError
from hasfl_ray.simulation.transport import MAX_ATTEMPTS, _lost, logger
from hasfl_ray.simulation.wire import pack, pack_units, unpack
from hasfl_ray.training.result import ClientResult
from hasfl_ray.training.task import ClientTask


@dataclass
class AsyncHandle:
    """A dispatched client: its task, the model it trains from (``params``: a reference, held until its training is
    known to have ended), the trainer slot and generation it went to, its two returns (the small report; the
    result, one packed object for the server) and how often it was sent. ``report`` is None once the training
    ended, and for a restored client."""

    task: Optional[ClientTask]
    slot: int
    generation: int
    report: Any
    result: Any
    params: Any = None
    attempts: int = 1


class AsyncTransport:
    """Mixed into :class:`~hasfl_ray.simulation.backend.RayBackend`: the asynchronous primitives of
    :class:`~hasfl_ray.engine.backend.Backend` on the trainer and server actors."""

    def dispatch(self, task: ClientTask) -> AsyncHandle:
        if self._params_ref is None:
            self._params_ref = self.server.params()
        handle = AsyncHandle(task, 0, 0, None, None, self._params_ref, 0)
        self._send_client(handle)
        if self.fault_round is not None and task.round == self.fault_round:  # testing: --fault-inject kill-trainer@N
            logger.warning("fault injection: killing trainer actor %d with dispatch %d in flight", handle.slot,
                           task.round)
            ray.kill(self.slots[handle.slot].actor, no_restart=True)
        return handle

    def _send_client(self, handle: AsyncHandle) -> None:
        """Send ``handle``'s client to the trainer with the fewest calls in flight, from the model it holds."""
        slot = min(self.slots, key=lambda s: (s.in_flight, s.index))
        handle.report, handle.result = slot.actor.run.options(num_returns=2).remote(
            self._carried(slot, [handle.params]), pack_units([([handle.task], False)]))
        handle.slot, handle.generation = slot.index, slot.generation
        handle.attempts += 1
        slot.in_flight += 1

    def _arrived(self, handle: AsyncHandle) -> None:
        """Wait for the client's training: a trainer that died is replaced and the client trained again (at most
        MAX_ATTEMPTS times in all); a trainer's error is one sentence."""
        while handle.report is not None:
            slot = self.slots[handle.slot]
            same_actor = handle.generation == slot.generation
            try:
                report = ray.get(handle.report)
            except RayActorError as error:
                if handle.attempts >= MAX_ATTEMPTS:
                    raise _lost(f"client {handle.task.client} of dispatch {handle.task.round} lost its trainer actor "
                                f"{handle.attempts} times", error) from None
                logger.warning("trainer actor %d died while training client %d of dispatch %d; training it again",
                               handle.slot, handle.task.client, handle.task.round)
                self.timing.retrained_clients.append(handle.task.client)
                if same_actor:
                    self._replace(slot)
                self._send_client(handle)
                continue
            except RayTaskError as error:
                cause = error.as_instanceof_cause()
                if isinstance(cause, ConfigError):
                    raise cause from None
                raise trainer_error([handle.task], getattr(error, "cause", None) or error, str(error),
                                    "dispatch") from None
            if same_actor:
                slot.in_flight -= 1
            self.total_train_seconds += report.train_seconds
            handle.report = handle.params = None

    def apply_arrivals(self, handles: Sequence[AsyncHandle], weights: Sequence[float], server_lr: float,
                       bases: Optional[Sequence[Optional[int]]] = None, optimizer: Any = None):
        for handle in handles:
            self._arrived(handle)
        try:
            (accepted, aggregate, self._frozen, self._frozen_layers), self._params_ref = self.server.arrivals(
                weights, server_lr, None if bases is None else list(bases), optimizer, [h.result for h in handles])
        except NonFiniteModelError as error:
            self._params_ref = None
            raise NonFiniteModelError(str(getattr(error, "cause", error))) from None
        return accepted, aggregate

    def handle_result(self, handle: AsyncHandle) -> ClientResult:
        self._arrived(handle)
        return unpack(ray.get(handle.result))[0]

    def restore_handle(self, result: ClientResult) -> AsyncHandle:
        return AsyncHandle(None, 0, 0, None, ray.put(pack((result,))), attempts=0)

    def keep_version(self, version: int) -> None:
        self.server.post("keep_version", version)  # in order before any later call to the server

    def release_version(self, version: int) -> None:
        self.server.post("release_version", version)

    def kept_versions(self) -> Dict[int, Any]:
        return unpack(self.server.call("kept_versions"))

    def restore_versions(self, versions: Mapping[int, Any]) -> None:
        self.server.call("restore_versions", pack(dict(versions)))

    def server_momentum(self) -> Optional[Dict[str, Any]]:
        return unpack(self.server.call("momentum_state"))

    def restore_server_momentum(self, state: Optional[Mapping[str, Any]]) -> None:
        self.server.call("restore_momentum", pack(state))

    def set_privacy(self, settings: Any) -> None:
        """:meth:`Server.set_privacy` on the server actor (docs/privacy.md)."""
        self.server.call("set_privacy", settings)


__all__ = ["AsyncHandle", "AsyncTransport"]
