"""The actor classes as plain objects (no Ray started): a capped model cache, results equal to the in-process path."""

import numpy as np
import pytest
import torch

pytest.importorskip("ray", reason="needs Ray")

from hasfl_ray.data import load_dataset  # noqa: E402
from hasfl_ray.engine import RunConfig, Server  # noqa: E402
from hasfl_ray.engine.backend import optimizer_settings  # noqa: E402
from hasfl_ray.engine.engine import initial_parameters  # noqa: E402
from hasfl_ray.simulation.actors import Inline, ServerActor, TrainerActor  # noqa: E402
from hasfl_ray.training.workspace import MODEL_CACHE  # noqa: E402
from hasfl_ray.simulation.wire import pack, unpack  # noqa: E402
from hasfl_ray.training.local import ClientTask, Trainer  # noqa: E402


@pytest.fixture(scope="module")
def setup():
    config = RunConfig(backend="local", clients=6, clients_per_round=6, local_epochs=1).resolved()
    dataset = load_dataset("digits", 6, 0.3, 0)
    return config, dataset, initial_parameters("digits", 0)


def test_trainer_keeps_at_most_the_recent_widths_and_matches_a_plain_trainer(setup):
    config, dataset, params = setup
    actor = TrainerActor(dataset, "digits", optimizer_settings(config), "cpu", 1)
    plain = Trainer(dataset, "digits", optimizer_settings(config), "cpu", 1)
    widths = [0.25, 0.3, 0.4, 0.5, 0.6, 0.75, 1.0]
    for client, width in enumerate(widths):
        task = ClientTask(client % 6, 0, width, 0.05, 0)
        report, packed = actor.run(params, [([task], False)])
        [result] = unpack(packed)
        assert report.client == task.client and report.clients == (task.client,) and report.train_seconds > 0
        assert len(actor.trainer.cached_widths) <= MODEL_CACHE
        assert actor.trainer.workspace.cached_bytes <= actor.trainer.workspace.cache_bound
        expected = plain.train(task, params)
        assert all((result.update[k] == expected.update[k]).all() for k in expected.update)
    assert actor.trainer.cached_widths[-1] == 1.0


def test_one_trainer_call_trains_its_units_in_order_as_one_returned_object(setup):
    """A call carries several units (single clients, a batched group): one packed object holds every result, in
    the call's task order, each equal to the client trained alone (a group: as Trainer.train_unit trains it)."""
    config, dataset, params = setup
    actor = TrainerActor(dataset, "digits", optimizer_settings(config), "cpu", 1)
    plain = Trainer(dataset, "digits", optimizer_settings(config), "cpu", 1)
    single = [ClientTask(4, 1, 0.5, 0.05, 0), ClientTask(1, 1, 1.0, 0.05, 0)]
    group = [ClientTask(0, 1, 0.75, 0.05, 0), ClientTask(2, 1, 0.75, 0.05, 0)]
    report, packed = actor.run(params, [(single, False), (group, True)])
    results = unpack(packed)
    expected = [plain.train(task, params) for task in single] + plain.train_unit(group, params)
    assert report.clients == (4, 1, 0, 2) and [r.client for r in results] == [4, 1, 0, 2]
    for got, want in zip(results, expected):
        assert got.num_samples == want.num_samples and got.loss == want.loss
        assert all(torch.equal(got.update[k], want.update[k]) for k in want.update)


def test_server_round_puts_the_calls_results_back_in_client_order(setup):
    """ServerActor.round takes the trainer calls' packed results in any order with their task positions, applies
    them in client order (as Server.apply on the list), and returns the packed summary and parameters."""
    config, dataset, params = setup
    trainer = Trainer(dataset, "digits", optimizer_settings(config), "cpu", 1)
    results = [trainer.train(ClientTask(i, 0, w, 0.05, 0), params) for i, w in ((0, 0.5), (3, 1.0), (4, 0.25))]
    actor = ServerActor("digits", params, dataset, 500, "reference", "cpu", 1)
    plain = Server("digits", params, dataset, 500, "reference", "cpu")
    summary, new_params = actor.round([3.0, 1.0, 2.0], 1.0, [[2, 0], [1]], None, pack((results[2], results[0])),
                                      pack((results[1],)))
    accepted, stats, frozen, frozen_layers = unpack(summary)
    _, expected = plain.apply(results, [3.0, 1.0, 2.0], 1.0)
    assert [r.client for r in accepted] == [0, 3, 4] and all(r.update == {} for r in accepted)
    assert torch.equal(stats.div_num, expected.div_num) and actor.params_sha256() == plain.params_sha256()
    assert frozen == plain.frozen_fraction() and frozen_layers == plain.frozen_by_layer()
    assert all(torch.equal(t, plain.params[name]) for name, t in unpack(new_params).items())
    assert actor.evaluate_at(unpack(new_params), "evaluate") == plain.evaluate()


def test_evaluation_on_a_trainer_equals_the_servers(setup):
    """The trainers evaluate a round's model with the server's own code, on a copy of the parameters they were
    given: the same accuracy, loss, per-width results and beats bitmasks, bit for bit; the server's own parameters
    are not touched (it may hold the next round's already)."""
    config, dataset, params = setup
    trainer = Trainer(dataset, "digits", optimizer_settings(config), "cpu", 1)
    plain = Server("digits", params, dataset, 500, "reference", "cpu")
    plain.apply([trainer.train(ClientTask(1, 0, 1.0, 0.05, 0), params)], [1.0], 1.0)
    round_params = plain.get_params()
    actor = TrainerActor(dataset, "digits", optimizer_settings(config), "cpu", 1, True, False, (500, None))
    server = ServerActor("digits", params, dataset, 500, "reference", "cpu", 1)
    assert actor.evaluate_at(round_params, "evaluate") == plain.evaluate()
    assert actor.evaluate_at(round_params, "evaluate_widths", [0.25, 0.5], None) == plain.evaluate_widths([0.25, 0.5])
    labels, beats = actor.evaluate_at(round_params, "test_beats", [0.5, 1.0], None)
    want_labels, want_beats = plain.test_beats([0.5, 1.0])
    assert np.array_equal(labels, want_labels) and all(np.array_equal(beats[w], want_beats[w]) for w in want_beats)
    assert server.evaluator(round_params, "evaluate") == plain.evaluate()
    assert server.params_sha256() != plain.params_sha256()  # the server actor still holds w^(0)
    with pytest.raises(ValueError, match="evaluation method 'apply'"):
        actor.evaluate_at(round_params, "apply")


def test_parameters_inside_the_calls_are_unpacked_once_per_version_and_train_as_the_parameters_themselves(setup):
    """A driver's server sends the round's parameters inside each call (Inline, no object store): the trainer
    unpacks them at the first call of a version and keeps them for the round's later calls (evaluations included);
    a new version replaces them; what it trains is what the parameters themselves give, bit for bit."""
    config, dataset, params = setup
    actor = TrainerActor(dataset, "digits", optimizer_settings(config), "cpu", 1, True, False, (500, None))
    plain = Trainer(dataset, "digits", optimizer_settings(config), "cpu", 1)
    task = ClientTask(2, 0, 0.5, 0.05, 0)
    first = [Inline(1, pack(params))]
    _, packed = actor.run(first, [([task], False)])
    held = actor.params
    assert all(torch.equal(held[k], params[k]) for k in params)
    actor.evaluate_at([Inline(1, pack(params))], "evaluate")  # another copy of version 1: not unpacked again
    assert actor.params is held
    [result] = unpack(packed)
    expected = plain.train(task, params)
    assert all(torch.equal(result.update[k], expected.update[k]) for k in expected.update)
    changed = {k: v + 1 for k, v in params.items()}
    actor.run([Inline(2, pack(changed))], [([task], False)])
    assert actor.params is not held and all(torch.equal(actor.params[k], changed[k]) for k in params)


def test_a_server_round_takes_results_the_driver_unpacked_as_they_arrived_as_their_packed_objects(setup):
    """The server in the driver reads a trainer call's results as soon as they arrive (while other calls train):
    apply_round given those unpacked tuples, packed ones, or a mix, gives the same model and summary."""
    config, dataset, params = setup
    trainer = Trainer(dataset, "digits", optimizer_settings(config), "cpu", 1)
    results = [trainer.train(ClientTask(i, 0, w, 0.05, 0), params) for i, w in ((0, 0.5), (3, 1.0), (4, 0.25))]
    calls = [(results[2], results[0]), (results[1],)]
    shas, summaries = [], []
    for given in ([pack(c) for c in calls], [unpack(pack(c)) for c in calls], [unpack(pack(calls[0])), pack(calls[1])]):
        server = ServerActor("digits", params, dataset, 500, "reference", "cpu", 1)
        accepted, _, frozen, _ = server.apply_round([3.0, 1.0, 2.0], 1.0, [[2, 0], [1]], None, given)
        shas.append(server.params_sha256())
        summaries.append(([r.client for r in accepted], frozen))
    assert len(set(shas)) == 1 and summaries[0] == summaries[1] == summaries[2] and summaries[0][0] == [0, 3, 4]


@pytest.mark.skipif(not __import__("hasfl_ray.allocator").allocator.enabled(),
                    reason="needs glibc's malloc_trim (Linux) and HASFL_MALLOC_TRIM not 0")
def test_a_trainer_hands_freed_memory_back_once_a_model_not_after_each_call(setup):
    """malloc_trim asked for once a model (made when due: hasfl_ray/allocator.py), as the local backend asks once a
    round: after the model's evaluation (a trainer's last work of a round, while the driver aggregates) or, where it evaluated nothing, as the next model arrives
    (the round's calls after it reuse the pages the last one freed): not after every training call."""
    from hasfl_ray import allocator

    config, dataset, params = setup
    actor = TrainerActor(dataset, "digits", optimizer_settings(config), "cpu", 1, True, False, (500, None))
    task = ClientTask(2, 0, 0.5, 0.05, 0)
    asked = allocator.spent["requests"]
    actor.run([Inline(1, pack(params))], [([task], False)])
    actor.run([Inline(1, pack(params))], [([task], False)])
    assert allocator.spent["requests"] == asked + 1  # as model 1 arrived
    actor.evaluate_at([Inline(1, pack(params))], "evaluate")
    assert allocator.spent["requests"] == asked + 2  # as its evaluation ended
    actor.evaluate_at([Inline(1, pack(params))], "evaluate_widths", [0.5, 1.0])
    assert allocator.spent["requests"] == asked + 2  # once a model
    actor.run([Inline(2, pack(params))], [([task], False)])
    actor.run([Inline(2, pack(params))], [([task], False)])
    assert allocator.spent["requests"] == asked + 2  # model 2 arrived with model 1's memory already handed back
    actor.run([Inline(3, pack(params))], [([task], False)])
    assert allocator.spent["requests"] == asked + 3  # model 2 was not evaluated here: as model 3 arrived


def test_a_call_naming_the_version_its_trainer_holds_evaluates_and_trains_as_one_carrying_the_parameters(setup):
    """Issue 46 item 3: a trainer's later calls of a round carry the version its first call brought (``Held``), not
    the parameters again; they give the same bits, and a version the trainer does not hold is a bug, said so."""
    from hasfl_ray.simulation.actors import Held

    config, dataset, params = setup
    task = ClientTask(3, 0, 0.75, 0.05, 0)
    carried = TrainerActor(dataset, "digits", optimizer_settings(config), "cpu", 1, True, False, (500, None))
    named = TrainerActor(dataset, "digits", optimizer_settings(config), "cpu", 1, True, False, (500, None))
    carried.run([Inline(1, pack(params))], [([task], False)])
    named.run([Inline(1, pack(params))], [([task], False)])
    want = carried.evaluate_at([Inline(1, pack(params))], "evaluate_widths", [0.5, 1.0])
    assert named.evaluate_at([Held(1)], "evaluate_widths", [0.5, 1.0]) == want
    _, want_packed = carried.run([Inline(1, pack(params))], [([task], False)])
    _, got_packed = named.run([Held(1)], [([task], False)])
    [want_result], [got_result] = unpack(want_packed), unpack(got_packed)
    assert all(torch.equal(got_result.update[k], want_result.update[k]) for k in want_result.update)
    with pytest.raises(RuntimeError, match="version 2, which this trainer does not hold"):
        named.evaluate_at([Held(2)], "evaluate")


def test_the_parameters_travel_once_per_trainer_and_version(monkeypatch):
    """Transport._carried: the first call to a trainer brings an Inline version, later ones to the same trainer name
    it (Held) until another version goes there; a replaced trainer (a new actor) gets the parameters again; an
    object-store reference always travels as it is."""
    from types import SimpleNamespace

    from hasfl_ray.simulation import transport
    from hasfl_ray.simulation.actors import Held
    from hasfl_ray.simulation.transport import RoundTiming, Transport, _Slot

    first, second = Inline(1, pack({"w": torch.ones(2)})), Inline(2, pack({"w": torch.zeros(2)}))
    a, b = _Slot(0, "actor a"), _Slot(1, "actor b")
    sent = [Transport._carried(slot, [params]) for slot, params in
            [(a, first), (a, first), (b, first), (a, first), (b, first), (a, second), (a, second), (b, first)]]
    assert [type(carried[0]).__name__ for carried in sent] == \
        ["Inline", "Held", "Inline", "Held", "Held", "Inline", "Held", "Held"]
    assert sent[6] == [Held(2)] and sent[7] == [Held(1)]
    monkeypatch.setattr(transport.ray, "kill", lambda actor, no_restart: None)
    started = SimpleNamespace(setup=SimpleNamespace(remote=lambda *args: None))
    backend = Transport()
    backend._trainer_class = SimpleNamespace(remote=lambda **process: started)
    backend._process, backend._trainer_args, backend.replaced_actors, backend.timing = {}, (), 0, RoundTiming()
    backend._replace(a)  # a dead trainer's successor holds nothing yet
    assert a.actor is started and Transport._carried(a, [second])[0] is second
    assert Transport._carried(a, [second]) == [Held(2)]
    reference = object()
    assert Transport._carried(a, [reference]) == [reference] and Transport._carried(a, [reference])[0] is reference


def test_the_packed_parameters_are_the_servers_bit_for_bit_and_a_copy_of_them(setup):
    """ServerActor.params packs the server's own tensors (no copy first): the same names, dtypes, shapes and bytes
    as Server.get_params, and a copy: the server's next update changes neither the packed buffer nor what it
    unpacks to."""
    config, dataset, params = setup
    actor = ServerActor("digits", params, dataset, 500, "reference", "cpu", 1)
    packed = actor.params()
    want = actor.server.get_params()
    got = unpack(packed)
    assert list(got) == list(want)
    assert all(got[k].dtype == want[k].dtype and torch.equal(got[k].view(-1).view(torch.uint8),
                                                            want[k].reshape(-1).view(torch.uint8)) for k in want)
    before = packed.buffer.copy()
    for tensor in actor.server.params.values():
        tensor.add_(1.0)
    assert np.array_equal(packed.buffer, before)
    assert all(torch.equal(unpack(packed)[k], want[k]) for k in want)
