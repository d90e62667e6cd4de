"""The local backend's deferred training in the asynchronous mode (hasfl_ray/engine/backend.py, LocalBackend.dispatch):
a server version's dispatches are trained later, back to back, before the server update, a checkpoint or a fault
reads them. Each run here is compared with the same run training every client at its dispatch: the same bits."""

import json
import os
import signal

import pytest

from hasfl_ray.engine import Engine, RunConfig
from hasfl_ray.engine.asynchronous import AsyncLoop
from hasfl_ray.engine.backend import Deferred, LocalBackend
from hasfl_ray.errors import RunInterrupted, TrainerError
from hasfl_ray.training.trainer import Trainer

ASYNC = dict(backend="local", mode="async", devices="lognormal", clients=12, clients_per_round=4, local_epochs=1,
             seed=5, concurrency=6, buffer_size=3, rounds=5, checkpoint_every=0, dropout=0.1)


def lines(out):
    with open(out / "metrics.jsonl", encoding="utf-8") as handle:
        return [{k: v for k, v in json.loads(line).items() if k != "wall_s"} for line in handle]


def at_dispatch(patch):
    """Every client trained at its dispatch (deferral switched off): the reference."""
    original = LocalBackend.defer_dispatches
    patch.setattr(LocalBackend, "defer_dispatches", lambda self, on, train_left=True: original(self, False, train_left))


def watch(patch):
    """Records, per call of Trainer.train, the dispatch number it trains, and per dispatch, how many clients wait
    untrained after it."""
    trained, waiting = [], []
    train, dispatch = Trainer.train, LocalBackend.dispatch
    patch.setattr(Trainer, "train", lambda self, task, params: trained.append(task.round) or train(self, task, params))

    def dispatching(self, task):
        handle = dispatch(self, task)
        waiting.append(len(self.deferred))
        return handle

    patch.setattr(LocalBackend, "dispatch", dispatching)
    return trained, waiting


def run(out, deferred=True, **changes):
    with pytest.MonkeyPatch.context() as patch:
        if not deferred:
            at_dispatch(patch)
        trained, waiting = watch(patch)
        summary = Engine(RunConfig(**{**ASYNC, **changes}), out_dir=str(out)).run()
    return summary, lines(out), trained, waiting


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The run trained at every dispatch, and the same run deferred."""
    root = tmp_path_factory.mktemp("deferral")
    return run(root / "at-dispatch", deferred=False), run(root / "deferred")


def test_deferred_training_gives_the_bits_of_training_at_each_dispatch(reference):
    (plain, plain_lines, plain_trained, plain_waiting), (summary, metrics, trained, waiting) = reference
    assert max(plain_waiting) == 0 and max(waiting) >= 2  # deferred: several dispatches' training waits
    assert trained == plain_trained == sorted(trained)  # the same clients, trained in dispatch order
    assert summary["params_sha256"] == plain["params_sha256"]
    assert metrics == plain_lines


def test_a_checkpoint_mid_version_trains_what_waits_and_resumes_as_never_stopped(tmp_path, reference):
    """SIGTERM at a dispatch after the first server update, with clients of that version still untrained: the
    checkpoint holds their trained updates, and the resumed run ends as the run trained at every dispatch."""
    (plain, plain_lines, _, _), _ = reference
    out, stopped_with = tmp_path / "run", []
    changes = dict(checkpoint_every=2)
    with pytest.MonkeyPatch.context() as patch:
        dispatch, calls = LocalBackend.dispatch, []

        def signalling(self, task):
            handle = dispatch(self, task)
            calls.append(task.round)
            if len(calls) == ASYNC["concurrency"] + 5:  # mid-version, after the first server update
                stopped_with.append(len(self.deferred))
                os.kill(os.getpid(), signal.SIGTERM)
            return handle

        patch.setattr(LocalBackend, "dispatch", signalling)
        with pytest.raises(RunInterrupted) as stop:
            Engine(RunConfig(**{**ASYNC, **changes}), out_dir=str(out)).run()
    assert stop.value.signal_number == signal.SIGTERM and stop.value.rounds_done >= 1
    assert stopped_with and stopped_with[0] >= 1  # untrained clients waited when the stop came
    resumed = Engine(RunConfig(**{**ASYNC, **changes}), out_dir=str(out), resume=True).run()
    assert resumed["params_sha256"] == plain["params_sha256"]
    assert lines(out) == plain_lines


@pytest.mark.parametrize("kind", ["nan-update", "inf-update"])
def test_a_poisoned_dispatch_behind_waiting_ones_gives_the_bits_of_training_at_dispatch(tmp_path, kind):
    fault = f"{kind}@{ASYNC['concurrency'] + 4}"  # after the first server update, behind untrained dispatches
    plain, plain_lines, plain_trained, _ = run(tmp_path / "at-dispatch", deferred=False, fault_inject=fault)
    summary, metrics, trained, waiting = run(tmp_path / "deferred", fault_inject=fault)
    assert waiting[ASYNC["concurrency"] + 3] >= 1  # (clients of that version waited when it was dispatched)
    assert sum(line["rejected_updates"] for line in metrics) == 1
    assert trained == plain_trained and summary["params_sha256"] == plain["params_sha256"]
    assert metrics == plain_lines


def test_a_trainer_error_behind_waiting_dispatches_fails_where_training_at_dispatch_fails(tmp_path):
    """The failing dispatch trains at once, after those waiting before it: the same clients trained, the same lines
    recorded, the same sentence."""
    fault = f"trainer-error@{ASYNC['concurrency'] + 4}"
    outcomes = []
    for name, deferred in (("at-dispatch", False), ("deferred", True)):
        out = tmp_path / name
        with pytest.MonkeyPatch.context() as patch:
            if not deferred:
                at_dispatch(patch)
            trained, waiting = watch(patch)
            with pytest.raises(TrainerError) as error:
                Engine(RunConfig(**{**ASYNC, "fault_inject": fault}), out_dir=str(out)).run()
        outcomes.append((str(error.value), trained, lines(out), waiting))
    (plain_error, plain_trained, plain_lines, _), (message, trained, metrics, waiting) = outcomes
    assert "of dispatch 10 failed (RuntimeError: injected trainer failure" in message
    assert message == plain_error and trained == plain_trained and trained[-1] == ASYNC["concurrency"] + 4
    assert metrics == plain_lines and len(metrics) >= 1
    assert max(waiting) >= 1


def test_a_waiting_handle_read_early_trains_every_client_waiting_in_order(tmp_path, reference):
    """A handle read before its server update (what a checkpoint's handle_result does) trains the clients waiting,
    oldest first, and the run's bits stay those of training at every dispatch."""
    (plain, plain_lines, plain_trained, _), _ = reference
    reads = []
    with pytest.MonkeyPatch.context() as patch:
        trained, _ = watch(patch)
        update = AsyncLoop.server_update

        def reading(self, wall_start):
            waiting = [entry for entry in self.state.in_flight.values() if type(entry.handle) is Deferred
                       and entry.handle.result is None]
            if waiting:
                newest = max(waiting, key=lambda entry: entry.dispatch)
                before, queued = len(trained), [handle.task.round for handle in self.backend.deferred]
                assert self.backend.handle_result(newest.handle).client == newest.client
                assert set(entry.dispatch for entry in waiting) <= set(queued)  # (and the buffer's, arrived)
                reads.append((trained[before:], sorted(queued)))
                assert not self.backend.deferred
            update(self, wall_start)

        patch.setattr(AsyncLoop, "server_update", reading)
        summary = Engine(RunConfig(**ASYNC), out_dir=str(tmp_path / "run")).run()
    assert reads and all(order == expected for order, expected in reads)
    assert trained == plain_trained and summary["params_sha256"] == plain["params_sha256"]
    assert lines(tmp_path / "run") == plain_lines
