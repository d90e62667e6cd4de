"""Accuracy at each width (issue 25 items 1, 6, 7): --eval-widths / --eval-every, metrics.jsonl's accuracy_at_width
and loss_at_width, summary.json's final and best per width, a plug-in's own sub-models, nothing else moved."""

import json
import math
import textwrap

import pytest
import torch
from click.testing import CliRunner

from hasfl_ray import simulate
from hasfl_ray.cli.main import main
from hasfl_ray.data import load_plugin_dataset
from hasfl_ray.engine import Engine, RunConfig
from hasfl_ray.engine.server import _evaluation_layout
from hasfl_ray.errors import ConfigError, PluginError
from hasfl_ray.evaluation import default_eval_widths, is_eval_round, width_key
from hasfl_ray.models import build_model, extract
from hasfl_ray.registry import lookup
from hasfl_ray.training.evaluate import evaluate

#: Every run here names its backend: the tests mind no Ray already running in this process, so the shared Ray of the
#: module before is kept into this one (tests/conftest.py).
RAY_MAY_ALREADY_RUN = True

SMALL = dict(rounds=4, clients=6, clients_per_round=3, seed=5, backend="local", warmup=1, t_adapt=1)


def lines_of(run_dir):
    with open(run_dir / "metrics.jsonl", encoding="utf-8") as handle:
        return [{k: v for k, v in json.loads(line).items() if k != "wall_s"} for line in handle]


def run(tmp_path, name, **kw):
    out = tmp_path / name
    engine = Engine(RunConfig(**{**SMALL, **kw}), out_dir=str(out))
    return engine.run(), lines_of(out), engine


def test_the_schedule_keys_and_defaults():  # issue 25 item 1
    assert [t for t in range(10) if is_eval_round(t, 10, 3)] == [2, 5, 8, 9]  # every 3rd and always the last
    assert [t for t in range(4) if is_eval_round(t, 4, 0)] == [3]
    assert [width_key(w) for w in (0.25, 0.5, 1.0, 0.125)] == ["0.25", "0.5", "1", "0.125"]
    assert default_eval_widths([0.5, 0.25, 0.5, 1.0]) == [0.25, 0.5, 1.0]
    assert default_eval_widths([0.5, 0.5]) == [0.5, 1.0]
    assert RunConfig(dataset="digits").resolved().eval_every == 1
    assert RunConfig(dataset="emnist").resolved().eval_every == 5
    assert RunConfig(eval_widths=[1, 0.5, 0.5]).eval_widths == [0.5, 1.0]


@pytest.mark.parametrize("key, value", [("eval_widths", [0.0]), ("eval_widths", [1.5]), ("eval_widths", []),
                                        ("eval_widths", "0.5"), ("eval_every", 0), ("local_eval_every", -1),
                                        ("local_eval_width", "max")])
def test_bad_values_are_refused_in_one_sentence(key, value):  # issue 25 item 1
    with pytest.raises(ConfigError, match=rf"^{key} is .*; expected [^\n]*$"):
        RunConfig(**{key: value})


def test_each_width_is_the_prefix_sub_model_and_width_1_is_test_accuracy(tmp_path):  # issue 25 item 1
    summary, lines, engine = run(tmp_path, "a", eval_widths=[0.25, 0.5], eval_every=2)
    assert [("accuracy_at_width" in line, "loss_at_width" in line) for line in lines] == \
        [(False, False), (True, True), (False, False), (True, True)]
    for line in lines[1::2]:
        assert list(line["accuracy_at_width"]) == ["0.25", "0.5", "1"]
        assert line["accuracy_at_width"]["1"] == line["test_accuracy"]
        assert line["loss_at_width"]["1"] == line["test_loss"]
    assert summary["accuracy_at_width_final"] == lines[-1]["accuracy_at_width"]
    assert summary["accuracy_at_width_best"] == {k: max(lines[1]["accuracy_at_width"][k], v)
                                                 for k, v in lines[3]["accuracy_at_width"].items()}
    # the final width-0.5 number, recomputed directly from the final global parameters
    params = engine.backend.get_params()
    model = build_model("digits", 0.5)
    specs = model.param_specs()
    with torch.no_grad():
        for name, param in model.named_parameters():
            param.copy_(extract(params[name], specs[name], 0.5))
    dataset = load_plugin_dataset(lookup("dataset", "digits"), engine.config)
    final = (summary["accuracy_at_width_final"]["0.5"], lines[-1]["loss_at_width"]["0.5"])
    plain = evaluate(model, dataset)  # the default memory layout: the same up to the convolution kernel's last bits
    assert final[0] == pytest.approx(plain[0], abs=2 / dataset.test_size) and final[1] == pytest.approx(plain[1],
                                                                                                      rel=1e-5)
    assert final == evaluate(_evaluation_layout(model), dataset)  # exactly, in the server's evaluation layout


def test_evaluation_moves_nothing_else(tmp_path):  # issue 25 item 7
    plain, plain_lines, _ = run(tmp_path, "full", eval_widths=[1.0])
    wide, wide_lines, _ = run(tmp_path, "wide", eval_widths=[0.125, 0.25, 0.5, 0.75], local_eval_every=1)
    assert wide["params_sha256"] == plain["params_sha256"]
    new = ("accuracy_at_width", "loss_at_width", "local_accuracy_mean", "local_accuracy_worst")
    assert [{k: v for k, v in line.items() if k not in new} for line in wide_lines] == \
        [{k: v for k, v in line.items() if k not in new} for line in plain_lines]
    assert plain_lines[-1]["accuracy_at_width"] == {"1": plain_lines[-1]["test_accuracy"]}  # --eval-widths full
    assert all("local_accuracy_mean" in line for line in wide_lines)


def test_the_flags_reach_the_run_and_the_api_returns_the_fields(tmp_path):  # issue 25 items 1, 6
    out = tmp_path / "cli"
    result = CliRunner().invoke(main, ["simulate", "--rounds", "2", "--clients", "6", "--clients-per-round", "3",
                                       "--backend", "local", "--eval-widths", "0.5,1", "--eval-every", "2",
                                       "--local-eval-every", "1", "--local-eval-width", "p-max", "--out", str(out),
                                       "--quiet"])
    assert result.exit_code == 0, result.output
    config = (out / "config.yaml").read_text()
    assert "eval_widths:\n- 0.5\n- 1.0" in config and "eval_every: 2" in config and "local_eval_width: p_max" in config
    summary = json.loads((out / "summary.json").read_text())
    assert list(summary["accuracy_at_width_final"]) == ["0.5", "1"] and summary["local_accuracy"]["width"] == "p_max"
    bad = CliRunner().invoke(main, ["simulate", "--rounds", "1", "--backend", "local", "--eval-widths", "half"])
    assert bad.exit_code == 2 and "--eval-widths is 'half'; expected comma-separated widths" in bad.output
    api = simulate(dataset="digits", algorithm="heterofl", backend="local", rounds=1, clients=6, clients_per_round=3)
    assert set(api["accuracy_at_width_final"]) == {"0.25", "0.5", "0.75", "1"}
    assert set(api["local_accuracy"]) >= {"mean", "worst", "p10", "median", "best", "per_tier", "width", "masked"}
    assert api["local_accuracy_unmasked"]["masked"] is False


PLUGIN = textwrap.dedent('''
    import torch
    from hasfl_ray.algorithms.heterofl import HeteroFL
    from hasfl_ray.models import build_model, extract

    class ZeroSubmodels(HeteroFL):
        """HeteroFL whose width-w sub-models for evaluation are all zeros (so every logit is 0)."""
        def submodel_for_eval(self, params, width):
            specs = build_model("digits").param_specs()
            return {n: torch.zeros_like(extract(t, specs[n], width)) for n, t in params.items()}

    class WrongShapes(HeteroFL):
        def submodel_for_eval(self, params, width):
            return dict(params)
''')


def test_a_plugin_is_evaluated_through_its_own_sub_models(tmp_path):  # issue 25 item 6
    plugin = tmp_path / "zero_plugin.py"
    plugin.write_text(PLUGIN)
    summary, lines, engine = run(tmp_path, "plug", algorithm=f"{plugin}:ZeroSubmodels", eval_widths=[0.5])
    dataset = load_plugin_dataset(lookup("dataset", "digits"), engine.config)
    labels = torch.cat([y for _, y in dataset.test_batches(500)])
    # all-zero logits: argmax is class 0 for every sample, the loss log(10)
    assert summary["accuracy_at_width_final"]["0.5"] == float((labels == 0).double().mean())
    assert math.isclose(lines[-1]["loss_at_width"]["0.5"], math.log(10), rel_tol=1e-6)
    assert summary["accuracy_at_width_final"]["1"] == summary["final_accuracy"]  # width 1: the global model
    baseline, _, _ = run(tmp_path, "base", algorithm="heterofl", eval_widths=[0.5])
    assert summary["params_sha256"] == baseline["params_sha256"]
    with pytest.raises(PluginError, match=r"returned for width 0.5 .* from submodel_for_eval\(\); expected parameter "
                                          r"'features.0.weight' as a finite float tensor of shape") as error:
        run(tmp_path, "wrong", algorithm=f"{plugin}:WrongShapes", eval_widths=[0.5], rounds=1)
    assert "\n" not in str(error.value)


def test_two_ray_actors_equal_the_local_backend(ray_local, tmp_path):  # issue 25 item 7
    kw = dict(eval_widths=[0.25, 0.5], local_eval_every=2, rounds=2)
    local, local_lines, _ = run(tmp_path, "local", **kw)
    remote, remote_lines, _ = run(tmp_path, "ray", backend="ray", actors=2, **kw)
    assert remote_lines == local_lines
    assert (tmp_path / "ray" / "clients.csv").read_text() == (tmp_path / "local" / "clients.csv").read_text()
    drop = ("wall_s", "startup_s", "backend", "ray", "execution")
    assert {k: v for k, v in remote.items() if k not in drop and k in local} == \
        {k: v for k, v in local.items() if k not in drop}
