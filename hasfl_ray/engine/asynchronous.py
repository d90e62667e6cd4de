"""The asynchronous run mode (docs/async.md): an event loop on the device clock in place of the round loop.

C clients train at once. Each is dispatched from the model the server holds then, at the width its algorithm
allocates; the clock says when its update arrives (its download, local steps and upload at that width on its
device, plus latency) or when it drops out. Events are taken in order of (simulated time, client id), so a run is
the same on every backend and actor count. An arrival goes into the buffer; with K updates buffered the server
applies them (FedBuff: their staleness-weighted mean; FedAsync, K = 1: the arrival mixed in with α s(τ)), records a
metrics line and moves the model version on. Then a new client is sampled among those available and not in flight,
and dispatched from the new model.

The engine's rooms do the rest: the algorithm (allocation, objective, observe), the backend (training, the server),
evaluation (:mod:`.evaluating`) and the records (:mod:`.records`); :mod:`.async_state` holds the loop's state and
what a checkpoint keeps of it.
"""

from __future__ import annotations

import heapq
import logging
import time
from collections import Counter
from typing import Any, Dict, List

import numpy as np

from hasfl_ray import allocator
from hasfl_ray.aggregation.asynchronous import buffered_step, mixing_step
from hasfl_ray.aggregation.server_optim import of_config
from hasfl_ray.algorithms import Arrival
from hasfl_ray.clock.records import width_label
from hasfl_ray.config.asynchronous import eval_due, parse_staleness, staleness_factor
from hasfl_ray.config.faults import parse_fault
from hasfl_ray.engine import privacy, records
from hasfl_ray.engine.async_state import AsyncState, InFlight
from hasfl_ray.engine.backend import RoundInterrupted
from hasfl_ray.engine.losses import loss_keys
from hasfl_ray.engine.progress import open_bar
from hasfl_ray.engine.participants import round_capacities, client_task, client_price, sub_models
from hasfl_ray.schedule import round_lr
from hasfl_ray.training.seed_blocks import MASK32, DispatchStreams
from hasfl_ray.training.seeding import STREAM_CLOCK, numpy_rng

logger = logging.getLogger(__name__)

#: The sub-streams of ``rng(seed, STREAM_CLOCK, dispatch, kind)`` an asynchronous run draws from (a synchronous run's
#: are kinds 0 and 1, keyed by round): the client sampled, and its dropout.
SAMPLING, DROPOUT = 2, 3
#: Random candidates tried for a dispatch before every client is asked (the rare path: nearly all are busy or away).
DRAWS = 1000
#: Candidates drawn at first (then twice as many each time, up to DRAWS): nearly always the first fits. Drawing in
#: pieces gives the same candidates as drawing DRAWS at once (numpy draws bounded integers one by one).
FIRST_DRAWS = 4


class AsyncLoop:
    """The event loop of one asynchronous run, over an :class:`~hasfl_ray.engine.engine.Engine`'s rooms."""

    def __init__(self, engine: Any):
        self.engine = engine
        c = engine.config
        self.config, self.clock, self.backend, self.algorithm = c, engine.clock, engine.backend, engine.algorithm
        self.concurrency, self.buffer_size = c.concurrency, c.buffer_size
        self.fedasync = c.async_rule == "fedasync"
        self.staleness = parse_staleness(c.staleness)
        self.optimizer = of_config(c)  # the server optimiser (FedBuff's momentum: fedavgm's heavy-ball step)
        self.state = AsyncState.fresh(c.clients)
        # the generators numpy_rng(seed, STREAM_CLOCK, n, kind) of dispatches n, derived a block at a time (the same
        # bits: hasfl_ray/training/seed_blocks.py); numpy's own where a run has 1 client or 2**32 (no draw there)
        self.samplings = DispatchStreams((c.seed, STREAM_CLOCK), (SAMPLING,)) if 2 <= c.clients <= MASK32 else None
        self.dropouts = DispatchStreams((c.seed, STREAM_CLOCK), (DROPOUT,))
        self.lr = (-1, 0.0)  # (server version, its learning rate)
        # --fault-inject KIND@N (testing): N counts dispatches; nan-update, inf-update and trainer-error go with
        # dispatch N's task (every backend); kill-trainer is the Ray backend's (it kills dispatch N's trainer)
        fault = parse_fault(c.fault_inject) if c.fault_inject else None
        self.fault = (fault[1], fault[0].split("-")[0]) if fault is not None and fault[0] != "kill-trainer" else None

    # -- sampling and dispatch ------------------------------------------------------------------------------------

    def sample(self, n: int) -> int:
        """Dispatch ``n``'s client: random candidates from ``rng(seed, STREAM_CLOCK, n, 2)`` until one is available
        now and not in flight; when DRAWS find none, the lowest id of those that are; when none is, -1."""
        now, busy, availability = self.clock.now, self.state.in_flight, self.clock.availability
        clients = self.config.clients
        if self.samplings is not None:
            rng = self.samplings(n)
            draw = rng.integers
        else:
            rng = numpy_rng(self.config.seed, STREAM_CLOCK, n, SAMPLING)
            draw = lambda high, size: rng.integers(0, high, size=size).tolist()  # noqa: E731
        drawn, size = 0, FIRST_DRAWS
        while drawn < DRAWS:
            size = min(size, DRAWS - drawn)
            for candidate in draw(clients, size):
                if candidate not in busy:
                    if availability.window(candidate, now)[0]:
                        return candidate
                    self.state.unavailable += 1
            drawn, size = drawn + size, 2 * size
        # every client asked, the run's stop asked every STOP_CHECK_EVERY of them (Clock._every_client)
        return next((i for i in self.clock._every_client() if i not in busy and availability.window(i, now)[0]), -1)

    def fill(self) -> None:
        """Dispatch until C clients are in flight (or waiting for one to become available). A stop asked while it
        looks for a client (:class:`RoundInterrupted`) leaves the state as before that dispatch: a resumed run
        draws it again, as a run never stopped does."""
        s = self.state
        while len(s.in_flight) < self.concurrency:
            n, unavailable = s.dispatches, s.unavailable
            s.dispatches += 1
            try:
                client = self.sample(n)
                if client >= 0:
                    self.start(client, n)
                    continue
                # nobody is available: the slot waits for the first client to come back (ties: the lowest id)
                now = self.clock.now
                wake, client = min((self.clock.availability.next_on(i, now), i) for i in self.clock._every_client()
                                   if i not in s.in_flight)
            except RoundInterrupted:
                s.dispatches, s.unavailable = n, unavailable
                raise
            s.push(InFlight(client, n, s.version, 0.0, now, wake, wake=True))

    def start(self, client: int, n: int) -> None:
        """Dispatch ``client`` now as dispatch ``n``: its width, cost and arrival (or drop-out) time; trained now
        from the current model unless it will drop out (its update never arrives). Its availability is asked
        first, before anything changes (a Markov chain drawn far ahead may stop the run there)."""
        s, c, clock, algorithm = self.state, self.config, self.clock, self.algorithm
        now, v = clock.now, s.version
        until = clock.availability.window(client, now)[1] - now
        algorithm.algorithm.now = now
        width = algorithm.allocate(v, [client])[client]
        shape = sub_models(algorithm, v, {client: width})[client]  # (width, depth) trained
        cost = client_price(algorithm, clock, v, client, shape)
        if c.async_rho:  # the proximal gradient ρ (w − w_received): one multiply-add a parameter a step, as FedProx's
            cost = cost.plus(step_macs=clock.costs.params(*shape))
        full = clock.seconds(client, cost)
        # (without dropout its stream decides nothing, and is not drawn)
        u = self.dropouts(n).random(2) if c.dropout > 0 else (1.0, 0.0)
        lost = bool(u[0] < c.dropout) or full > until
        end = now + (float(u[1]) * full if u[0] < c.dropout else until if full > until else full)
        s.bytes_down += int(cost.bytes_down)
        s.dispatched += 1
        clock.invited[client] = True
        clock.busy[client] += end - now
        handle = None
        if not lost:
            if self.lr[0] != v:  # (the learning rate of the server version, once a version)
                self.lr = (v, round_lr(c.lr, c.lr_decay, v, c.lr_milestones, c.lr_gamma))
            lr = self.lr[1]
            task = client_task(algorithm, c, v, client, width, shape, lr, number=n, proximal=c.async_rho or 0.0)
            if self.fault is not None and self.fault[0] == n:
                task.fault = self.fault[1]
            handle = self.backend.dispatch(task)
            if self.fedasync:
                self.backend.keep_version(v)
        s.push(InFlight(client, n, v, width, now, end, lost=lost, bytes_up=int(cost.bytes_up), handle=handle))

    # -- the loop ---------------------------------------------------------------------------------------------------

    def run(self) -> Dict[str, Any]:
        engine, c, s = self.engine, self.config, self.state
        # the local backend leaves a server version's training for later (its bookkeeping back to back, in warm
        # caches): trained before the server update, a checkpoint or a fault (the same model: the same bits); a
        # plug-in's objective is not deferred (it could change after its dispatch, as it cannot on Ray)
        trusted = getattr(self.algorithm, "_trusted", None)
        self.backend.defer_dispatches(trusted is not None and trusted("objective"))
        try:
            return self._run()
        finally:  # (at the end: the clients still in flight never arrive, so are not trained)
            self.backend.defer_dispatches(False, train_left=False)

    def _run(self) -> Dict[str, Any]:
        engine, c, s = self.engine, self.config, self.state
        start = time.perf_counter()
        engine._in_loop, engine._loop_start, engine._bar = True, start, open_bar(engine, "server update")
        if c.width_assignment == "dynamic" and s.version < c.rounds:  # (after the last: the last update's stay)
            self.capacities(s.version)
        update_start = time.perf_counter()
        while s.version < c.rounds:
            # a stop is asked at every event (a run may dispatch for long without a server update: clients that
            # drop out, or are rarely available) and inside the scans of every client (RoundInterrupted)
            if engine.stop_signals.requested():
                engine._interrupted(start)
            try:
                self.fill()
            except RoundInterrupted:
                engine._interrupted(start)
            end, client = heapq.heappop(s.queue)
            entry = s.in_flight.pop(client)
            before, self.clock.now = self.clock.now, end
            if entry.wake:
                try:
                    self.start(client, entry.dispatch)
                except RoundInterrupted:  # as before the event: the slot still waits
                    self.clock.now = before
                    s.push(entry)
                    engine._interrupted(start)
                continue
            if entry.lost:
                s.dropped += 1
                continue
            s.bytes_up += entry.bytes_up
            s.sent[client] += 1
            s.buffer.append(entry)
            if len(s.buffer) < self.buffer_size:
                continue
            try:
                self.server_update(update_start)
            except RoundInterrupted:
                engine._interrupted(start)
            update_start = time.perf_counter()
            if engine.stopped_early is not None:  # a callback's Stop (hasfl_ray/callbacks.py)
                break
            # (after the last update too when its local-accuracy pass was cut short: --resume computes it)
            if engine.stop_signals.requested() and (s.version < c.rounds or engine.local_owed is not None):
                engine._interrupted(start)
        engine._in_loop = False
        return engine.finish(engine.elapsed_before + time.perf_counter() - start)

    def capacities(self, version: int) -> None:
        """Dynamic width assignment: every client's p^max for the server version ``version`` (as for a round)."""
        e = self.engine
        e.p_max = round_capacities(self.config.effective_data_seed, version, self.config.clients, e.ladder)
        self.algorithm.set_capacities(version, e.p_max)

    def server_update(self, wall_start: float) -> None:
        """Apply the buffer: weights n_i s(τ_i) (1 s(τ_i) with ``aggregation_weights: count``), FedBuff's step
        η_g Σ n_i s(τ_i) / Σ n_i (η_g the algorithm's times ``server_lr``; ``server_momentum`` β: m ← β m + that
        step, w ← w + m) or FedAsync's η_g α s(τ);
        the algorithm told and observing; the metrics line recorded (evaluated when due); the version moved on."""
        e, c, s = self.engine, self.config, self.state
        self.backend.train_deferred()  # (before the algorithm or the model changes)
        entries, s.buffer = s.buffer, []
        v, now = s.version, self.clock.now
        taus = [v - entry.version for entry in entries]
        factors = [staleness_factor(*self.staleness, tau) for tau in taus]
        counts = self.algorithm.aggregation_weights([entry.client for entry in entries])
        kept = [k for k, weight in enumerate(counts) if weight > 0]
        if len(kept) < len(entries):
            logger.warning("server update %d: client(s) %s have aggregation weight 0 and are left out", v,
                           ", ".join(str(entries[k].client) for k in range(len(entries)) if k not in kept))
        if self.fedasync and kept:
            weights, lr = mixing_step(counts[0], factors[0], c.async_alpha, self.algorithm.server_lr)
        else:
            weights, lr = buffered_step([counts[k] for k in kept], [factors[k] for k in kept],
                                        self.optimizer.step_lr(self.algorithm.server_lr, c.server_lr))
        self.algorithm.arrived(v, [Arrival(entries[k].client, entries[k].width, entries[k].version, taus[k],
                                           factors[k], entries[k].start_s, entries[k].end_s) for k in kept])
        # an update whose weight n_i s(τ_i) underflows to 0 (a steep staleness function: polynomial:1e300 at τ = 1)
        # counts for nothing: left out of the mean, whose step still counts its n_i (FedBuff's Σ n_i)
        applied = [k for k, weight in zip(kept, weights) if weight > 0]
        if len(applied) < len(kept):
            logger.warning("server update %d: the weight n s(tau) of client(s) %s is 0 in floating point "
                           "(staleness %s under %s), so their updates count for nothing", v,
                           ", ".join(str(entries[k].client) for k in kept if k not in applied),
                           ", ".join(str(taus[k]) for k in kept if k not in applied), c.staleness)
            weights = [weight for weight in weights if weight > 0]
        handles = [entries[k].handle for k in applied]
        if handles:
            results, aggregate = self.backend.apply_arrivals(handles, weights, lr, [entries[k].version
                                                                                   for k in applied]
                                                             if self.fedasync else None, self.optimizer)
        else:
            results, aggregate = [], e._empty_aggregate()
        if self.fedasync:
            for entry in entries:
                self.backend.release_version(entry.version)
        accepted = {r.client for r in results}
        rejected = [entries[k].client for k in applied if entries[k].client not in accepted]
        if rejected:
            logger.warning("server update %d: rejected the non-finite update of client(s) %s", v,
                           ", ".join(map(str, rejected)))
        self.algorithm.observe(v, results, aggregate)
        for entry, tau in zip(entries, taus):
            s.stale_sum[entry.client] += tau
        line = self.line(v, entries, taus, results, aggregate, rejected)
        last = v + 1 == c.rounds or (e.stopped_early or {}).get("round") == v  # (dp_epsilon's stop: the line's)
        due = eval_due(v, last, now, s.last_update_s, c.eval_every_updates, c.eval_every_seconds)
        s.version, s.last_update_s = v + 1, now
        if c.width_assignment == "dynamic" and s.version < c.rounds:
            self.capacities(s.version)
        if due:
            line = records.complete(line, e.request_evaluation(v), wall_start)
        else:
            line["wall_s"] = time.perf_counter() - wall_start
        records.record(e, (line, None, None, None))
        allocator.release()  # the update's freed memory back to the system (hasfl_ray/allocator.py)

    def line(self, v: int, entries: List[InFlight], taus: List[int], results, aggregate, rejected) -> Dict[str, Any]:
        """Server update ``v``'s metrics line: the synchronous line's keys (round = v), the clock's (since the last
        update) and the asynchronous ones: version, staleness_mean and staleness_max of the applied updates,
        buffer_fill (applied / K), in_flight, dispatched."""
        e, s, now = self.engine, self.state, self.clock.now
        used = [r.width if r.trained_width is None else r.trained_width for r in results] or \
            [entry.width for entry in entries]
        h = self.algorithm.h_tilde()
        tiers = Counter(width_label(e.p_max[entry.client]) for entry in entries)
        line = {"round": v, "test_accuracy": None, "test_loss": None, "avg_p": float(np.mean(used)),
                "coverage": aggregate.covered_fraction, "frozen_fraction": self.backend.frozen_fraction(),
                "mean_h": float(h.mean()) if h is not None else None, "rejected_updates": len(rejected),
                "frozen_by_layer": self.backend.frozen_by_layer(), "coverage_by_layer": aggregate.covered_by_layer,
                "sim_time_s": now, "round_time_s": now - s.last_update_s, "idle_s": 0.0,
                "bytes_down": s.bytes_down, "bytes_up": s.bytes_up, "invited": s.dispatched, "late_updates": 0,
                "dropped_updates": s.dropped, "partial_updates": 0, "unavailable_clients": s.unavailable,
                "participants_by_tier": {key: tiers[key] for key in sorted(tiers, key=float)},
                "version": v + 1, "staleness_mean": float(np.mean(taus)), "staleness_max": int(max(taus)),
                "buffer_fill": len(entries) / self.buffer_size, "in_flight": len(s.in_flight),
                **loss_keys(results), **privacy.line_keys(e, v, aggregate), "wall_s": None}
        s.bytes_down = s.bytes_up = s.dispatched = s.dropped = s.unavailable = 0
        return line

    # -- checkpoints ------------------------------------------------------------------------------------------------

    def state_dict(self) -> Dict[str, Any]:
        """What a checkpoint keeps of the loop (:meth:`AsyncState.state_dict`), FedAsync's kept versions and FedBuff's
        server momentum buffer included."""
        state = self.state.state_dict(self.backend, self.backend.kept_versions() if self.fedasync else None)
        state["server_momentum"] = self.backend.server_momentum() if self.optimizer.stateful else None
        return state

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        self.state = AsyncState.from_state(state, self.backend)
        if self.fedasync:
            self.backend.restore_versions(state["versions"])
        if self.optimizer.stateful:
            self.backend.restore_server_momentum(state.get("server_momentum"))


def run(engine: Any) -> Dict[str, Any]:
    """Run ``engine``'s asynchronous run to its last server update (``rounds`` of them), continuing a checkpoint's
    loop where it has one; returns the summary."""
    loop = AsyncLoop(engine)
    engine.asynchronous = loop
    saved = (engine.checkpoint.clock or {}).get("async") if engine.checkpoint is not None else None
    if saved is not None:
        loop.load_state_dict(saved)
    try:
        return loop.run()
    finally:
        if engine._bar:  # the bar over the server updates, however the loop ends
            engine._bar.close()
        engine._bar = None


__all__ = ["AsyncLoop", "DRAWS", "DROPOUT", "FIRST_DRAWS", "SAMPLING", "run"]
