"""Where the Ray backend reaches its server: the server actor, or the same server in the driver (``server_placement``,
:func:`~hasfl_ray.simulation.placement.server_placement`).

Both wrap one :class:`~hasfl_ray.simulation.actors.ServerActor`, so a round's aggregation, the evaluation of a lost
trainer's share, the asynchronous versions and the server optimiser's state are the same code and the same bits
wherever it runs. They differ in how a call travels: to the actor, a Ray call whose returns come back through the
object store (the trainers' results go from their processes to the server's, its summary and the new parameters to
the driver); in the driver, a plain call on the results the driver reads from the object store itself, and only the
new parameters go into the object store, once, for the trainers.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence, Tuple

import ray

from hasfl_ray.simulation.actors import Inline, ServerActor
from hasfl_ray.simulation.transport import Transport
from hasfl_ray.simulation.wire import Packed, unpack

#: What a round gives the driver: the accepted results, the aggregate's statistics, the frozen fractions (overall,
#: per layer); and the reference to the new parameters, one object-store object every trainer reads.
Summary = Tuple[Any, Any, float, Any]


class ActorServer:
    """The server on its own actor (``server_placement: actor``)."""

    where = "actor"

    def __init__(self, actor: Any) -> None:
        self.actor = actor

    def params(self) -> Any:
        """A reference to the global parameters, packed."""
        return self.actor.params.remote()

    def round(self, weights: Sequence[float], server_lr: float, layout: Sequence[Sequence[int]], optimizer: Any,
              results: Sequence[Any], keep_updates: bool) -> Tuple[Summary, Any]:
        """:meth:`ServerActor.round` on the actor (Ray resolves the results' references there)."""
        summary, params = self.actor.round.options(num_returns=2).remote(list(weights), server_lr, layout, optimizer,
                                                                          *results, keep_updates=keep_updates)
        return unpack(Transport._from_server(summary)), params

    def arrivals(self, weights: Sequence[float], server_lr: float, bases: Optional[Sequence[Optional[int]]],
                 optimizer: Any, results: Sequence[Any]) -> Tuple[Summary, Any]:
        summary, params = self.actor.arrivals.options(num_returns=2).remote(list(weights), server_lr, bases,
                                                                             optimizer, *results)
        return unpack(Transport._from_server(summary)), params

    @staticmethod
    def receive(result: Any) -> Any:
        """A trainer call's results as they arrive: the reference, which Ray resolves on the server actor."""
        return result

    def call(self, method: str, *args: Any) -> Any:
        """``method(*args)`` on the actor, waited for (a dead server actor is one sentence)."""
        return Transport._from_server(getattr(self.actor, method).remote(*args))

    def post(self, method: str, *args: Any) -> None:
        """``method(*args)`` on the actor, not waited for (Ray runs it before any later call there)."""
        getattr(self.actor, method).remote(*args)

    def stop(self) -> None:
        ray.kill(self.actor, no_restart=True)


class DriverServer:
    """The server in the driver (``server_placement: driver``): the trainers' results read from the object store
    here, aggregated here, the new parameters put into the object store once. No server process, no server call, no
    summary through the object store: one hop fewer per round."""

    where = "driver"

    def __init__(self, server: ServerActor, inline_bytes: int = 0) -> None:
        self.server = server
        #: Parameters packed into at most this many bytes travel inside the calls (:class:`Inline`); larger ones,
        #: or any with 0 (a joined cluster, whose calls Ray would store anyway), as one object-store object.
        self.inline_bytes = inline_bytes
        self.version = 0

    def params(self) -> Any:
        """The global parameters, packed, as the trainers' calls carry them: an :class:`Inline` (no object-store
        put: the first call to each trainer brings them, the trainer keeps them for the round's later calls) or
        a reference to one object-store object."""
        packed = self.server.params()
        if packed.buffer.nbytes > self.inline_bytes:
            return ray.put(packed)
        self.version += 1
        return Inline(self.version, packed)

    def receive(self, result: Any) -> Any:
        """A trainer call's results as they arrive (while other calls of the round still train): read (unless the
        call's one object, already read with its report, brought them) and unpacked here now, off the hand-off
        between rounds."""
        return unpack(result if isinstance(result, Packed) else ray.get(result))

    def round(self, weights: Sequence[float], server_lr: float, layout: Sequence[Sequence[int]], optimizer: Any,
              results: Sequence[Any], keep_updates: bool) -> Tuple[Summary, Any]:
        summary = self.server.apply_round(list(weights), server_lr, layout, optimizer, results, keep_updates)
        return summary, self.params()

    def arrivals(self, weights: Sequence[float], server_lr: float, bases: Optional[Sequence[Optional[int]]],
                 optimizer: Any, results: Sequence[Any]) -> Tuple[Summary, Any]:
        summary = self.server.apply_arrivals(list(weights), server_lr, bases, optimizer, ray.get(list(results)))
        return summary, self.params()

    def call(self, method: str, *args: Any) -> Any:
        return getattr(self.server, method)(*args)

    post = call

    def stop(self) -> None:
        self.server = None
