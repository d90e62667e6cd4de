"""Where the model is frozen (issue 25 item 4): metrics.jsonl's ``frozen_by_layer`` and ``coverage_by_layer`` every
round, checked against float64 references built from the round's participants' masks, and the coverage warning (log
and summary.json) naming the layers that stay at w^(0); the same on Ray with 2 actors as in this process."""

import json
import math

import pytest
import torch

from hasfl_ray.engine import Engine, RunConfig
from hasfl_ray.engine.coverage import NEGLIGIBLE, coverage_warning, frozen_layers, frozen_layers_phrase
from hasfl_ray.engine.server import layer_coverage
from hasfl_ray.models import build_model
from hasfl_ray.models.slicing import extract_window, mask

# Uniform: every participant at p = min(0.5, p^max), so the tail channels of every scaled layer never train.
#: Every run here names its backend: the tests mind no Ray already running in this process, so the shared Ray of the
#: module before is kept into this one (tests/conftest.py).
RAY_MAY_ALREADY_RUN = True

UNIFORM = dict(backend="local", algorithm="uniform", rounds=6, clients=6, clients_per_round=3, seed=4, warmup=1)
SPECS = build_model("digits").param_specs()


def recorded(config, out_dir=None):
    """Run ``config``, recording each round's participants' widths and window offsets; (engine, rounds)."""
    engine = Engine(RunConfig.from_dict(config), out_dir=out_dir)
    engine.prepare()
    rounds = []
    allocate = engine.algorithm.allocate

    def recording(round, participants):
        widths = allocate(round, participants)
        rounds.append({i: (widths[i], engine.algorithm.window_offset(round, i)) for i in participants})
        return widths

    engine.algorithm.allocate = recording
    engine.run()
    return engine, rounds


def covered_mask(name, width, offset):
    """Float64 full-shape 0/1 mask of the coordinates a client at ``width`` and window ``offset`` trains."""
    spec = SPECS[name]
    if offset == 0:
        return mask(spec, width, torch.float64)
    positions = torch.arange(math.prod(spec.shape), dtype=torch.float64).reshape(spec.shape)
    out = torch.zeros(math.prod(spec.shape), dtype=torch.float64)
    out[extract_window(positions, spec, width, offset).reshape(-1).long()] = 1.0
    return out.reshape(spec.shape)


def reference_coverage(participants):
    """name -> float64 fraction of the parameter inside the union of the participants' masks."""
    out = {}
    for name in SPECS:
        union = torch.zeros(SPECS[name].shape, dtype=torch.float64)
        for width, offset in participants.values():
            union = torch.maximum(union, covered_mask(name, width, offset))
        out[name] = float(union.mean())
    return out


def weighted(by_layer):
    """The whole-model fraction from a per-layer one (weights: the parameters' sizes)."""
    total = sum(math.prod(spec.shape) for spec in SPECS.values())
    return sum(by_layer[name] * math.prod(spec.shape) for name, spec in SPECS.items()) / total


def test_uniform_run_records_which_layers_stay_frozen_and_the_warning_names_them(tmp_path):
    engine, rounds = recorded(UNIFORM, str(tmp_path / "uniform"))
    ever = {name: torch.zeros(spec.shape, dtype=torch.float64) for name, spec in SPECS.items()}
    lines = [json.loads(line) for line in (tmp_path / "uniform" / "metrics.jsonl").read_text().splitlines()]
    assert len(lines) == len(rounds) == UNIFORM["rounds"]
    for line, participants in zip(lines, rounds):
        assert max(width for width, _ in participants.values()) <= 0.5
        assert list(line["coverage_by_layer"]) == list(line["frozen_by_layer"]) == list(SPECS)
        assert line["coverage_by_layer"] == pytest.approx(reference_coverage(participants), abs=1e-12)
        for name in SPECS:
            for width, offset in participants.values():
                ever[name] = torch.maximum(ever[name], covered_mask(name, width, offset))
        # every coordinate some round's participant covered moved; none other did
        assert line["frozen_by_layer"] == pytest.approx({n: 1 - float(m.mean()) for n, m in ever.items()}, abs=1e-12)
        # the existing whole-model figures are the size-weighted means of the new ones
        assert weighted(line["coverage_by_layer"]) == pytest.approx(line["coverage"], abs=1e-12)
        assert weighted(line["frozen_by_layer"]) == pytest.approx(line["frozen_fraction"], abs=1e-12)
    last = lines[-1]["frozen_by_layer"]
    # the tail channels: half of every conv/BN/bias channel, 3/4 of a weight scaled on both sides; the output bias
    # (the 10 classes, never sliced) trains from the first round
    assert last["features.0.weight"] == 0.5 and last["fc1.weight"] == 0.75 and last["fc2.bias"] == 0.0
    # the warning: in the log (once, naming the most frozen layers) and in summary.json (every frozen layer)
    log = (tmp_path / "uniform" / "log.txt").read_text()
    assert log.count("has stayed at w^(0)") == 1
    assert "(features.4.weight 75.0 %, fc1.weight 75.0 %, features.0.weight 50.0 %" in log
    assert "more layers)" in log
    summary = json.loads((tmp_path / "uniform" / "summary.json").read_text())
    block = summary["coverage_warning"]
    assert block["frozen_layers"] == {name: f for name, f in sorted(last.items(), key=lambda kv: -kv[1]) if f > 0}
    assert "fc2.bias" not in block["frozen_layers"] and block["frozen_fraction"] == lines[-1]["frozen_fraction"]


def test_the_warning_reads_runs_written_before_the_per_layer_fields():
    old = [{"round": t, "frozen_fraction": 0.7} for t in range(8)]  # a metrics.jsonl of an earlier version
    block = coverage_warning(old, warmup=1)
    assert block is not None and "frozen_layers" not in block and block["frozen_fraction"] == 0.7
    assert frozen_layers(old[-1]) is None and frozen_layers_phrase(old[-1]) == ""
    # a layer at or below the negligible fraction is not named; ties keep the model's order
    line = {"frozen_by_layer": {"a": 0.5, "b": NEGLIGIBLE, "c": 0.8, "d": 0.5}}
    assert list(frozen_layers(line).items()) == [("c", 0.8), ("a", 0.5), ("d", 0.5)]
    assert frozen_layers_phrase(line) == " (c 80.0 %, a 50.0 %, d 50.0 %)"


def test_layer_coverage_of_windows_at_mixed_offsets_matches_the_masks():
    # clients' windows at different offsets (the union is not one window): counted on a mask, like the reference
    full = {name: torch.randn(spec.shape) for name, spec in SPECS.items()}

    def coverage(participants):
        updates = [{name: extract_window(full[name], SPECS[name], width, offset) for name in SPECS}
                   for width, offset in participants.values()]
        return layer_coverage(SPECS, updates, [offset for _, offset in participants.values()])

    mixed = {0: (0.25, 0), 1: (0.5, 3), 2: (0.25, 7), 3: (0.5, 3)}
    assert coverage(mixed) == pytest.approx(reference_coverage(mixed), abs=1e-12)
    # one shared offset (FedRolex's round): nested windows, the widest is the union
    shared = {0: (0.25, 5), 1: (0.75, 5)}
    assert coverage(shared) == pytest.approx(reference_coverage(shared), abs=1e-12)
    # a parameter no client sent (not trained) is not covered
    assert layer_coverage(SPECS, [{"fc2.bias": torch.zeros(10)}], [0])["fc1.weight"] == 0.0


def test_fedrolex_on_ray_with_two_actors_equals_the_local_backend(ray_local, tmp_path):
    # seed 3: no full-width participant, so each round's window leaves part of every scaled layer uncovered
    config = dict(backend="local", algorithm="fedrolex", rounds=2, clients=6, clients_per_round=3, seed=3)
    local, rounds = recorded(config)
    for line, participants in zip(local.history, rounds):
        assert line["coverage_by_layer"] == pytest.approx(reference_coverage(participants), abs=1e-12)
    on_ray, _ = recorded({**config, "backend": "ray", "actors": 2})
    keys = ("frozen_by_layer", "coverage_by_layer", "frozen_fraction", "coverage")
    assert [{k: line[k] for k in keys} for line in on_ray.history] == [{k: line[k] for k in keys}
                                                                       for line in local.history]
    first, last = (line["frozen_by_layer"]["fc1.weight"] for line in on_ray.history)
    assert 0 < last < first < 1  # the second round's window trained part of what the first left at w^(0)
