"""The actor classes as plain objects (no Ray started): a capped model cache, results equal to the in-process path."""

import pytest

pytest.importorskip("ray", reason="needs Ray")

from hasfl_ray.data import load_dataset  # noqa: E402
from hasfl_ray.engine import RunConfig, Server  # noqa: E402
from hasfl_ray.engine.backend import optimizer_settings  # noqa: E402
from hasfl_ray.engine.engine import initial_parameters  # noqa: E402
from hasfl_ray.simulation.actors import CACHED_WIDTHS, ServerActor, TrainerActor  # noqa: E402
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
    actor.begin_round(params)
    widths = [0.25, 0.3, 0.4, 0.5, 0.6, 0.75, 1.0]
    for client, width in enumerate(widths):
        task = ClientTask(client % 6, 0, width, 0.05, 0)
        report, result = actor.train(task)
        assert report.client == task.client and report.train_seconds > 0
        assert len(actor.trainer.cached_widths) <= CACHED_WIDTHS
        expected = plain.train(task, params)
        assert all((result.update[k] == expected.update[k]).all() for k in expected.update)
    assert actor.trainer.cached_widths[-1] == 1.0


def test_server_actor_applies_results_in_the_order_given(setup):
    config, dataset, params = setup
    trainer = Trainer(dataset, "digits", optimizer_settings(config), "cpu", 1)
    results = [trainer.train(ClientTask(i, 0, w, 0.05, 0), params) for i, w in ((0, 0.5), (3, 1.0), (4, 0.25))]
    actor = ServerActor("digits", params, dataset, 500, "reference", "cpu", 1)
    plain = Server("digits", params, dataset, 500, "reference", "cpu")
    accepted, stats = actor.apply([3.0, 1.0, 2.0], 1.0, *results)
    _, expected = plain.apply(results, [3.0, 1.0, 2.0], 1.0)
    assert [r.client for r in accepted] == [0, 3, 4] and all(r.update == {} for r in accepted)
    assert (stats.div_num == expected.div_num).all() and actor.params_sha256() == plain.params_sha256()
    assert actor.evaluate() == plain.evaluate()
