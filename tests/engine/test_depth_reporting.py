"""What a run with depth sub-models reports (issue 44 item 1c): DepthFL's global accuracy is the ensemble of the full
network's exits, accuracy_at_depth every exit alone; in a width_depth run the accuracy at width w is that of the
sub-model a client allocated w trains (its width at its depth, ScaleFL's level), and a depth client's local accuracy
is scored at its own (width, depth)."""

from __future__ import annotations

import json

import torch
from torch import nn

from hasfl_ray.engine import Engine, RunConfig
from hasfl_ray.engine.depth_eval import eval_shape
from hasfl_ray.engine.server import Server
from hasfl_ray.models import build_model
from hasfl_ray.models.slicing import extract
from hasfl_ray.training.evaluate import evaluate

BASE = dict(dataset="digits", rounds=3, clients=8, clients_per_round=4, backend="local", seed=5, lr=0.05)


class Ensemble(nn.Module):
    """The mean of a model's exits' logits, written out here (not the engine's)."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, x):
        outs = self.model.forward_exits(x)
        return sum(outs) / len(outs)


def loaded(name, params, width=1.0, depth=None):
    model = build_model(name, width, depth)
    specs = build_model(name).param_specs()
    with torch.no_grad():
        for key, param in model.named_parameters():
            param.copy_(extract(params[key], specs[key], width))
    return model


def run(tmp_path, monkeypatch, **config):
    asked = []
    original = Server.test_beats

    def spy(self, widths, submodels=None):
        asked.append(list(widths))
        return original(self, widths, submodels)

    monkeypatch.setattr(Server, "test_beats", spy)
    engine = Engine(RunConfig(**{**BASE, **config}), out_dir=str(tmp_path / "run"))
    summary = engine.run()
    lines = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    return engine, summary, lines, asked


def test_depthfls_global_accuracy_is_the_ensemble_and_each_exit_is_reported(tmp_path, monkeypatch):
    engine, summary, lines, asked = run(tmp_path, monkeypatch, algorithm="depthfl")
    server, params = engine.backend.server, engine.backend.get_params()
    name = engine.model_name
    ensemble = evaluate(Ensemble(loaded(name, params)), server.dataset, server.eval_batch_size, server.eval_indices)
    deepest = evaluate(loaded(name, params), server.dataset, server.eval_batch_size, server.eval_indices)
    shallow = evaluate(loaded(name, params, 1.0, 1), server.dataset, server.eval_batch_size, server.eval_indices)
    last = lines[-1]
    assert last["test_accuracy"] == ensemble[0] and summary["final_accuracy"] == ensemble[0]
    assert last["accuracy_at_depth"] == {"1": shallow[0], "2": deepest[0]}
    assert summary["accuracy_at_depth_final"] == last["accuracy_at_depth"]
    # accuracy at each tier's width: the sub-model that tier trains (1/4, 1/2: depth 1; 3/4: the whole network)
    # (the server evaluates sub-models channels-last: a last-bit tie may flip one sample, never more here)
    at_width, one = last["accuracy_at_width"], 1.0 / server.dataset.test_size + 1e-12
    assert set(at_width) == {"0.25", "0.5", "0.75", "1"} and at_width["1"] == ensemble[0]
    assert all(abs(at_width[k] - shallow[0]) <= one for k in ("0.25", "0.5")) and at_width["0.75"] == deepest[0]
    # local accuracy: each client at its own depth (tiers 1/4, 1/2: depth 1 at full width; 3/4, 1: the whole network)
    plan = engine.algorithm.depth_plan
    expected = sorted({eval_shape(plan, float(w)) for w in engine.algorithm.p_current}, key=str)
    assert sorted(set(asked[-1]), key=str) == expected and (1.0, 1) in expected


def test_a_width_depth_runs_accuracy_at_width_is_each_levels_sub_model(tmp_path, monkeypatch):
    engine, summary, lines, asked = run(tmp_path, monkeypatch, algorithm="scalefl",
                                        algorithm_options={"scalefl_exits": "1,1,2,2"})
    server, params = engine.backend.server, engine.backend.get_params()
    name = engine.model_name
    at_width = lines[-1]["accuracy_at_width"]
    for key, depth in (("0.25", 1), ("0.5", 1), ("0.75", None)):
        model = loaded(name, params, float(key), depth)  # the server's runs channels-last below width 1: the last bits
        # of a logit may differ, so a tie may break the other way on some sample; never more than one here
        accuracy = evaluate(model, server.dataset, server.eval_batch_size, server.eval_indices)[0]
        assert abs(at_width[key] - accuracy) <= 1.0 / server.dataset.test_size + 1e-12, key
    assert at_width["1"] == lines[-1]["test_accuracy"]
    assert summary["accuracy_at_width_final"] == at_width
    assert {(0.25, 1), (0.5, 1)} <= set(asked[-1])  # the shallow levels' local accuracy at their exit
