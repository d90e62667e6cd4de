"""The registered ``depthfl`` and ``scalefl`` (issue 44 item 2): a round's aggregation through the engine, the server
kernel and DepthFL's FedDyn correction (``Algorithm.post_aggregate``) against each rules module's float64
``aggregate`` (depth prefixes of both depths mixed in one round), and what each client trains."""

from __future__ import annotations

import pytest
import torch

from hasfl_ray.algorithms.league import depthfl as depthfl_rules
from hasfl_ray.algorithms.league import scalefl as scalefl_rules
from hasfl_ray.engine import Engine, RunConfig
from hasfl_ray.engine.server import Server
from hasfl_ray.models import build_model
from hasfl_ray.models.slicing import extract

BASE = dict(dataset="digits", rounds=2, clients=8, clients_per_round=4, backend="local", seed=3, lr=0.05)


def captured_run(monkeypatch, **config):
    """Run ``config`` in-process; returns (per round: the global params before it and each accepted client's update
    with its width), the final params and the engine."""
    rounds = []
    original = Server.apply

    def apply(self, results, weights, server_lr=1.0, *args, **kwargs):
        assert all(w == 1.0 for w in weights)  # both methods: the unweighted mean over holders
        rounds.append((self.get_params(), [({n: t.clone() for n, t in r.update.items()}, r.width) for r in results]))
        return original(self, results, weights, server_lr, *args, **kwargs)

    monkeypatch.setattr(Server, "apply", apply)
    engine = Engine(RunConfig(**{**BASE, **config}))
    engine.run()
    return rounds, engine.backend.get_params(), engine


def test_a_depthfl_round_is_the_strategys_aggregate_with_feddyn(monkeypatch):
    rounds, final, engine = captured_run(monkeypatch, algorithm="depthfl")
    afters = [before for before, _ in rounds[1:]] + [final]
    alpha, n = 0.1, 8
    h = {name: torch.zeros_like(t, dtype=torch.float64) for name, t in rounds[0][0].items()}
    depths = build_model(engine.model_name).param_depths()
    mixed = False
    for (before, updates), after in zip(rounds, afters):
        clients = [{name: before[name] + delta for name, delta in update.items()} for update, _ in updates]
        held = {max(depths[name] for name in client) for client in clients}
        mixed = mixed or held == {1, 2}
        expected, h = depthfl_rules.aggregate(before, clients, h, alpha, n, feddyn=True)
        for name in before:
            torch.testing.assert_close(after[name].to(torch.float64), expected[name], rtol=1e-5, atol=1e-6)
    assert mixed, "no round mixed depth-1 and depth-2 clients: the test would not check the prefixes"
    server_h = engine.algorithm.server_h
    for name in h:
        torch.testing.assert_close(server_h[name].to(torch.float64), h[name], rtol=1e-4, atol=1e-7)
    assert engine.config.sub_model == "depth" and engine.config.momentum == 0.0 and engine.config.lr_decay == 0.998
    from hasfl_ray.engine.post_aggregate import corrects

    assert corrects(engine.algorithm)


def test_without_feddyn_the_depthfl_round_is_the_count_mean(monkeypatch):
    from hasfl_ray.engine.post_aggregate import corrects

    rounds, final, engine = captured_run(monkeypatch, algorithm="depthfl",
                                         algorithm_options={"depthfl_feddyn": False})
    assert not corrects(engine.algorithm)  # no correction: the engine does not even read the parameters
    before, updates = rounds[-1]
    clients = [{name: before[name] + delta for name, delta in update.items()} for update, _ in updates]
    zeros = {name: torch.zeros_like(t) for name, t in before.items()}
    expected, _ = depthfl_rules.aggregate(before, clients, zeros, 0.1, 8, feddyn=False)
    for name in before:
        torch.testing.assert_close(final[name].to(torch.float64), expected[name], rtol=1e-5, atol=1e-6)


def test_a_scalefl_round_is_average_weights(monkeypatch):
    rounds, final, engine = captured_run(monkeypatch, algorithm="scalefl",
                                         algorithm_options={"scalefl_exits": "1,1,2,2"})
    specs = build_model(engine.model_name).param_specs()
    afters = [before for before, _ in rounds[1:]] + [final]
    widths = set()
    for (before, updates), after in zip(rounds, afters):
        clients, flags = [], []
        for update, width in updates:
            widths.add(width)
            clients.append({name: extract(before[name], specs[name], width) + delta for name, delta in update.items()})
            flags.append({name: True for name in update})
        expected = scalefl_rules.aggregate(before, clients, flags)
        for name in before:
            torch.testing.assert_close(after[name], expected[name], rtol=1e-5, atol=1e-6)
    assert len(widths) > 1  # several levels trained together
    assert engine.config.sub_model == "width_depth" and engine.config.depths == [1, 1, 2, 2]


def test_a_scalefl_client_trains_its_width_up_to_its_levels_exit(monkeypatch):
    """Level widths 1/4 and 1/2 stop at exit 1: their updates hold the stage-1 slices and exit 1 only."""
    rounds, _, engine = captured_run(monkeypatch, algorithm="scalefl", algorithm_options={"scalefl_exits": "1,1,2,2"})
    full = build_model(engine.model_name)
    specs, depths = full.param_specs(), full.param_depths()
    for _, updates in rounds:
        for update, width in updates:
            depth = 1 if width <= 0.5 else 2
            assert set(update) == {name for name in specs if depths[name] <= depth}
            assert all(tuple(t.shape) == specs[name].sliced_shape(width) for name, t in update.items())


def test_the_depthfl_objective_is_the_rules_mutual_loss_with_feddyn():
    """The objective's loss on a depth-2 digits model equals the rules module's mutual loss plus FedDyn's terms."""
    from hasfl_ray.algorithms.depthfl import MutualObjective
    from hasfl_ray.data import load_dataset
    from hasfl_ray.models import register_model
    from hasfl_ray.models.choice import with_exits

    dataset = with_exits(load_dataset("digits", num_clients=6, alpha=0.3, seed=0))
    register_model(dataset.model, dataset.model_config)
    torch.manual_seed(0)
    model = build_model(dataset.model, 1.0, 2)
    initial = {name: p.detach().clone() for name, p in model.named_parameters()}
    h = {name: torch.randn(p.numel()) * 0.01 for name, p in model.named_parameters()}
    options = depthfl_rules.DepthFLOptions()
    objective = MutualObjective(0.3, options, dict(h))
    objective.setup(model, initial, 1.0, torch.Generator())
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.01)
    x, y = torch.randn(5, 1, 8, 8), torch.tensor([0, 1, 2, 3, 4])
    expected = depthfl_rules.mutual_loss(model.forward_exits(x), y, 0.3) + depthfl_rules.feddyn_penalty(
        dict(model.named_parameters()), initial, h, options.depthfl_alpha)
    torch.testing.assert_close(objective.loss(model, x, y), expected)
    extra = objective.finish(model, initial, 1, 0.1)["depthfl_h"]
    new = depthfl_rules.feddyn_update(h, dict(model.named_parameters()), initial, options.depthfl_alpha)
    assert set(extra) == set(new) and all(torch.equal(extra[n], new[n]) for n in new)


@pytest.mark.parametrize("rounds,start,active", [(8, 0.25, [False, False, False, True]), (8, 0.0, [False, True])])
def test_scalefl_distillation_starts_after_the_sources_fraction_of_the_rounds(rounds, start, active):
    from hasfl_ray.algorithms.scalefl import ScaleFL
    import numpy as np

    config = RunConfig(**{**BASE, "rounds": rounds, "algorithm": "scalefl",
                          "algorithm_options": {"scalefl_exits": "1,1,2,2", "scalefl_kd_start": start,
                                                "scalefl_kd_gamma": 0.05}}).resolved()
    algorithm = ScaleFL(config, np.ones(8), np.ones(8, dtype=np.int64))
    assert [algorithm.objective(t, 0, 1.0).active for t in range(len(active))] == active


PLUGINS = """import torch
from hasfl_ray import Algorithm


class Undo(Algorithm):
    def post_aggregate(self, round, before, after, results):
        assert results and set(before) == set(after)
        return before


class Bad(Algorithm):
    def post_aggregate(self, round, before, after, results):
        return {"nothing": torch.zeros(1)}
"""


def test_post_aggregate_replaces_the_global_model_and_a_bad_answer_is_one_sentence(tmp_path):
    """The hook's answer becomes the global model (here: the model before every round, so nothing moves); a mapping
    that lacks a parameter is one PluginError sentence naming the algorithm and the method."""
    from hasfl_ray.engine.participants import initial_parameters
    from hasfl_ray.errors import PluginError

    (tmp_path / "hooks.py").write_text(PLUGINS)
    engine = Engine(RunConfig(**{**BASE, "algorithm": f"{tmp_path / 'hooks.py'}:Undo"}))
    engine.run()
    start = initial_parameters(engine.model_name, BASE["seed"])
    assert all(torch.equal(engine.backend.get_params()[n], start[n]) for n in start)
    with pytest.raises(PluginError, match=r"returned a dict from post_aggregate\(\); expected None or a mapping of "
                                          r"every parameter name"):
        Engine(RunConfig(**{**BASE, "algorithm": f"{tmp_path / 'hooks.py'}:Bad"})).run()
