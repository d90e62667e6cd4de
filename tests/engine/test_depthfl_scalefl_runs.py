"""Runs of ``--algorithm depthfl`` and ``scalefl`` (issue 44 item 2): the same result on Ray as locally and after a
resume (DepthFL's FedDyn state h_i in memory or in ``--control-variates-dir``), and bad input refused in one sentence
with exit status 2."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from hasfl_ray.cli.main import main

RUN = ["simulate", "--dataset", "digits", "--rounds", "3", "--clients", "6", "--clients-per-round", "3",
       "--checkpoint-every", "1", "--quiet"]
METHODS = {"depthfl": ["--algorithm", "depthfl"],
           "scalefl": ["--algorithm", "scalefl", "--algo-opt", "scalefl_exits=1,1,2,2",
                       "--algo-opt", "scalefl_kd_gamma=0.05", "--algo-opt", "scalefl_kd_start=0.3"],
           # a ResNet, so ScaleFL's own exit heads (scalefl_exit_head: source), at a quarter of its width to stay small
           "scalefl-resnet": ["--algorithm", "scalefl", "--model", "preresnet18", "--global-width", "0.25",
                              "--widths", "0.0625,0.125,0.1875,0.25", "--algo-opt", "scalefl_exits=1,2,3,4",
                              "--algo-opt", "scalefl_kd_gamma=0.05"]}


def sha(out):
    return json.loads((out / "summary.json").read_text())["params_sha256"]


def evaluations(out):
    keys = ("test_accuracy", "accuracy_at_depth", "accuracy_at_width", "local_accuracy_mean")
    return [{k: line.get(k) for k in keys} for line in map(json.loads, (out / "metrics.jsonl").read_text().splitlines())]


@pytest.fixture(scope="module")
def local_runs(tmp_path_factory):
    runs = {}
    for method, flags in METHODS.items():
        out = tmp_path_factory.mktemp(method) / "run"
        result = CliRunner().invoke(main, RUN + flags + ["--backend", "local", "--out", str(out)])
        assert result.exit_code == 0, result.output
        runs[method] = out
    return runs


@pytest.mark.parametrize("method", sorted(METHODS))
def test_ray_gives_the_local_result_bit_for_bit(ray_local, tmp_path, local_runs, method):
    out = tmp_path / "ray"
    result = CliRunner().invoke(main, RUN + METHODS[method] + ["--backend", "ray", "--actors", "1", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert sha(out) == sha(local_runs[method])
    assert evaluations(out) == evaluations(local_runs[method])


@pytest.mark.parametrize("method,extra", [("depthfl", []), ("depthfl", ["--control-variates-dir", "HDIR"]),
                                          ("scalefl", []), ("scalefl-resnet", [])])
def test_a_resumed_run_gives_the_uninterrupted_result(tmp_path, local_runs, method, extra):
    extra = [str(tmp_path / "h") if flag == "HDIR" else flag for flag in extra]
    out = tmp_path / "run"
    crashed = CliRunner().invoke(main, RUN + METHODS[method] + extra + ["--backend", "local", "--fault-inject",
                                                                        "trainer-error@2", "--out", str(out)])
    assert crashed.exit_code == 1 and "injected trainer failure" in crashed.output, crashed.output
    resumed = CliRunner().invoke(main, ["simulate", "--out", str(out), "--resume", "--quiet"])
    assert resumed.exit_code == 0, resumed.output
    assert sha(out) == sha(local_runs[method])
    assert evaluations(out) == evaluations(local_runs[method])
    if extra:  # the h_i of every client that trained, one file each
        assert sorted(p.name for p in (tmp_path / "h").glob("client_*.pt"))


def test_scalefl_on_a_resnet_trains_the_sources_exit_heads(local_runs):
    """Its exits 1-3 are the source's Classifier (three 3x3 convs, norms, linear; hasfl_ray.models.depth_heads), not
    DepthFL's attention and separable convs: what the checkpoint holds."""
    import torch

    params = torch.load(local_runs["scalefl-resnet"] / "checkpoints" / "latest.pt", weights_only=False)["params"]
    for k in (1, 2, 3):
        assert tuple(params[f"exit{k}.conv3.weight"].shape) == (16 * 2 ** (k - 1),) * 2 + (3, 3)
        assert not any(name.startswith(f"exit{k}.att") or ".seps." in name for name in params)


def test_feddyn_changes_the_result(tmp_path, local_runs):
    """The correction is applied: DepthFL without FedDyn ends elsewhere."""
    out = tmp_path / "plain"
    result = CliRunner().invoke(main, RUN + METHODS["depthfl"] + ["--algo-opt", "depthfl_feddyn=false",
                                                                  "--backend", "local", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert sha(out) != sha(local_runs["depthfl"])


@pytest.mark.parametrize("flags,sentence", [
    (["--algorithm", "depthfl", "--mode", "async", "--devices", "lognormal"],
     "mode is 'async' but DepthFL's FedDyn server correction is defined per synchronous round over all clients; "
     "expected --mode sync, or depthfl_feddyn false"),
    (["--algorithm", "depthfl", "--sub-model", "width_depth"],
     "sub_model is 'width_depth' but algorithm depthfl trains depth sub-models at full width; expected sub_model "
     "depth (or left unset)"),
    (["--algorithm", "depthfl", "--algo-opt", "depthfl_alpha=0"], "depthfl_alpha"),
    (["--algorithm", "scalefl", "--algo-opt", "scalefl_kd_gamma=-1"], "scalefl_kd_gamma is -1"),
    (["--algorithm", "scalefl", "--model", "preresnet18", "--algo-opt", "scalefl_exit_head=bogus"],
     "scalefl_exit_head is 'bogus'; expected source (ScaleFL's own Classifier after each exit's stage) or depthfl "
     "(DepthFL's bottleneck exits)"),
    # not a string at all: the type check names the values too (the option field's choices)
    (["--algorithm", "scalefl", "--model", "preresnet18", "--algo-opt", "scalefl_exit_head=1"],
     "scalefl_exit_head is 1; expected a string: one of source, depthfl"),
    (["--algorithm", "depthfl", "--algo-opt", "depthfl_kd=maybe"], "depthfl_kd"),
    (["--algorithm", "scalefl", "--algo-opt", "scalefl_exits=1,2"],
     "scalefl_exits is '1,2' (2 levels) but the width ladder has 4 widths (0.25, 0.5, 0.75, 1); expected one number "
     "of exits per ladder width, shallowest level first"),
    (["--algorithm", "scalefl", "--algo-opt", "scalefl_exits=2,1,1,1"], "scalefl_exits is '2,1,1,1'"),
    (["--algorithm", "scalefl", "--algo-opt", "scalefl_exits=1,2,3,4"],  # h71: it named depths, never given
     "scalefl_exits is '1,2,3,4' (the depths [1, 2, 3, 4]) but model 'digits+exits' has 2 depths"),
    (["--algorithm", "scalefl", "--depths", "1,1,2,3"], "depths is [1, 1, 2, 3] but model 'digits+exits' has 2"),
    (["--algorithm", "scalefl", "--algo-opt", "scalefl_exits=1,1,2,2", "--depths", "1,2,2,2"],
     "depths is [1, 2, 2, 2] but scalefl_exits gives the levels' exits '1,1,2,2'; expected depths left unset"),
    (["--algorithm", "scalefl", "--algo-opt", "scalefl_exits=1,1,2,2", "--sub-model", "depth"],
     "sub_model is 'depth' but algorithm scalefl scales width and depth together"),
])
def test_bad_input_is_one_sentence_and_exit_2(tmp_path, flags, sentence):
    out = tmp_path / "bad"
    result = CliRunner().invoke(main, RUN + flags + ["--backend", "local", "--out", str(out)])
    assert result.exit_code == 2, result.output
    text = result.output.strip()
    assert sentence in text and "Traceback" not in text and len(text.splitlines()) == 1, text
    assert not (out / "summary.json").exists() and not (out / "metrics.jsonl").exists()


def test_depths_come_without_sub_model_for_the_methods_that_set_it(tmp_path):
    """depthfl and scalefl set sub_model themselves, so --depths alone is theirs (every other algorithm still needs
    --sub-model with it)."""
    out = tmp_path / "depths"
    result = CliRunner().invoke(main, ["simulate", "--dataset", "digits", "--rounds", "1", "--clients", "6",
                                       "--clients-per-round", "3", "--algorithm", "depthfl", "--depths", "1,1,1,2",
                                       "--backend", "local", "--quiet", "--out", str(out)])
    assert result.exit_code == 0, result.output
    text = (out / "config.yaml").read_text()
    assert "sub_model: depth\n" in text and "depths:\n- 1\n- 1\n- 1\n- 2\n" in text, text
    refused = CliRunner().invoke(main, ["simulate", "--dataset", "digits", "--rounds", "1", "--algorithm", "heterofl",
                                        "--depths", "1,1,1,2", "--backend", "local", "--quiet",
                                        "--out", str(tmp_path / "no")])
    assert refused.exit_code == 2 and "but sub_model is 'width'" in refused.output


def test_scalefl_levels_grow_in_width_and_depth_whatever_the_ladders_order(tmp_path):
    """h71: scalefl_exits paired with the ladder in its given order, so `--widths 1,0.5 --algo-opt
    scalefl_exits=1,2` trained width 1 to one exit and width 0.5 to two (ScaleFL's levels inverted), and `--depths`
    could invert them too (`--depths 2,2,1,1`), both exit 0. Level l is now the l-th narrowest width; depths that give
    a wider width fewer exits are one sentence."""
    def run(name, *flags):
        out = tmp_path / name
        result = CliRunner().invoke(main, RUN + ["--backend", "local", "--widths", "1,0.5", "--algorithm", "scalefl",
                                                 *flags, "--out", str(out)])
        return result, out

    by_exits, out = run("exits", "--algo-opt", "scalefl_exits=1,2")
    assert by_exits.exit_code == 0, by_exits.output
    assert "depths:\n- 2\n- 1\n" in (out / "config.yaml").read_text()  # width 1 two exits, width 0.5 one
    by_depths, other = run("depths", "--depths", "2,1")
    assert by_depths.exit_code == 0, by_depths.output
    summaries = [json.loads((o / "summary.json").read_text())["params_sha256"] for o in (out, other)]
    assert summaries[0] == summaries[1]
    refused, gone = run("inverted", "--depths", "1,2")
    text = refused.output.strip()
    assert refused.exit_code == 2 and len(text.splitlines()) == 1, text
    assert "depths is [1, 2], which gives width 1 fewer exits (1) than the narrower width 0.5 (2)" in text
    assert not gone.exists()
