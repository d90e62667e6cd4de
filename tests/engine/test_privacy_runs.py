"""Client-level DP in whole runs (docs/privacy.md): ε is dp-accounting's own for the same noise multiplier, sampling
and steps; local and Ray add the same noise; resume gives the uninterrupted run's model and ε; the run stops before
exceeding --dp-epsilon; every algorithm and the asynchronous mode run under DP; bad values are refused in one
sentence."""

from __future__ import annotations

import functools
import sys

import pytest

from tests.cli.sentences import invoke, refused
from tests.engine.run_outputs import lines, run_into, summary

dp_accounting = pytest.importorskip("dp_accounting", reason="the privacy extra (dp-accounting) is not installed")

RUN = ["simulate", "--rounds", "3", "--clients", "6", "--clients-per-round", "3", "--quiet",
       "--dp-noise-multiplier", "1.1", "--dp-clip", "0.5"]
run = functools.partial(run_into, RUN)


def own_rdp(z, clients, sampled, steps, delta, count_sigma=None):
    """dp-accounting's RDP for `steps` draws of `sampled` of `clients` without replacement (replace-one), the clipped
    sum's Gaussian of std z·C against its replace-one sensitivity 2C."""
    gaussian = dp_accounting.GaussianDpEvent(z / 2)
    if count_sigma:
        gaussian = dp_accounting.ComposedDpEvent([gaussian, dp_accounting.GaussianDpEvent(count_sigma)])
    accountant = dp_accounting.rdp.RdpAccountant(neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE)
    accountant.compose(dp_accounting.SampledWithoutReplacementDpEvent(clients, sampled, gaussian), steps)
    return accountant.get_epsilon(delta)


@pytest.fixture(scope="module")
def local_run(tmp_path_factory):
    return run(tmp_path_factory.mktemp("dp"), "local", "--backend", "local")


def test_epsilon_is_dp_accountings_own_every_round(local_run):
    history = lines(local_run)
    delta = 6 ** -1.1
    assert [line["dp_updates"] for line in history] == [1, 2, 3]
    for line in history:
        assert line["dp_epsilon"] == own_rdp(1.1, 6, 3, line["dp_updates"], delta)
    assert summary(local_run)["dp_epsilon"] == history[-1]["dp_epsilon"]
    assert summary(local_run)["dp_delta"] == delta
    assert history[0]["dp_epsilon"] < history[1]["dp_epsilon"] < history[2]["dp_epsilon"]


def test_pld_is_dp_accountings_own(tmp_path):
    from hasfl_ray.config import RunConfig
    from hasfl_ray.engine import privacy

    config = RunConfig(clients=6, clients_per_round=3, dp_noise_multiplier=2.0, dp_accountant="pld", dp_delta=1e-5)
    accountant = dp_accounting.pld.PLDAccountant(neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE)
    accountant.compose(dp_accounting.GaussianDpEvent(2.0), 4)
    assert privacy.epsilon(config, 4) == accountant.get_epsilon(1e-5)


def test_dp_off_writes_no_dp_key(tmp_path):
    out = tmp_path / "off"
    assert invoke("simulate", "--rounds", "1", "--clients", "6", "--clients-per-round", "3", "--quiet",
                  "--backend", "local", "--out", out).exit_code == 0
    assert not [k for line in lines(out) for k in line if k.startswith("dp_")]
    assert not [k for k in summary(out) if k.startswith("dp_")]


def test_local_and_ray_add_the_same_noise(tmp_path, local_run):
    pytest.importorskip("ray", reason="needs Ray")
    ray_run = run(tmp_path, "ray", "--backend", "ray", "--actors", "1")
    assert summary(ray_run)["params_sha256"] == summary(local_run)["params_sha256"]
    keys = ("dp_epsilon", "dp_clip", "dp_clipped", "dp_updates")
    assert [[line[k] for k in keys] for line in lines(ray_run)] == [[line[k] for k in keys] for line in lines(local_run)]


def test_resume_with_adaptive_clipping_is_bit_for_bit(tmp_path):
    extra = ["--backend", "local", "--dp-adaptive-quantile", "0.5", "--rounds", "4", "--checkpoint-every", "1"]
    whole = run(tmp_path, "whole", *extra)
    out = tmp_path / "crashed"
    crashed = invoke(*RUN, *extra, "--fault-inject", "trainer-error@2", "--out", out)
    assert crashed.exit_code == 1, crashed.output
    resumed = invoke("simulate", "--out", out, "--resume", "--quiet")
    assert resumed.exit_code == 0, resumed.output
    assert summary(out)["params_sha256"] == summary(whole)["params_sha256"]
    assert lines(out)[-1]["dp_clip"] == lines(whole)[-1]["dp_clip"]
    assert [line["dp_epsilon"] for line in lines(out)] == [line["dp_epsilon"] for line in lines(whole)]
    clips = [line["dp_clip"] for line in lines(whole)]
    assert len(set(clips)) == 4  # the clip moved every round (adaptive)
    assert lines(whole)[-1]["dp_epsilon"] == own_rdp(1.1, 6, 3, 4, 6 ** -1.1, count_sigma=3 / 20)


def test_stops_before_exceeding_the_budget(tmp_path, local_run):
    history = lines(local_run)
    budget = (history[1]["dp_epsilon"] + history[2]["dp_epsilon"]) / 2  # two rounds fit, the third would not
    out = run(tmp_path, "budget", "--backend", "local", "--dp-epsilon", str(budget))
    assert len(lines(out)) == 2 and summary(out)["dp_epsilon"] <= budget
    assert summary(out)["stopped_early"]["round"] == 1
    assert "dp_epsilon" in summary(out)["stopped_early"]["reason"]


def test_async_composes_per_server_update(tmp_path):
    out = run(tmp_path, "async", "--backend", "local", "--mode", "async", "--async-rule", "fedbuff",
              "--concurrency", "3", "--buffer-size", "2", "--rounds", "2", "--devices", "lognormal")
    accountant = dp_accounting.rdp.RdpAccountant(neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE)
    accountant.compose(dp_accounting.GaussianDpEvent(1.1 / 2), 2)
    assert lines(out)[-1]["dp_epsilon"] == accountant.get_epsilon(6 ** -1.1)
    assert summary(out)["dp_sampling"].startswith("none")


@pytest.mark.parametrize("algorithm", ["hasfl", "heterofl", "fjord", "uniform", "random-budget", "fedavg", "fedprox",
                                       "scaffold", "fedrolex", "fluid"])
def test_every_algorithm_runs_under_dp(tmp_path, algorithm):
    extra = ["--classifier-aggregation", "label_split"] if algorithm == "heterofl" else []  # the label holders' path
    out = run(tmp_path, algorithm, "--backend", "local", "--rounds", "2", "--algorithm", algorithm, *extra)
    assert [line["dp_updates"] for line in lines(out)] == [1, 2]
    assert all(line["dp_clip"] == 0.5 for line in lines(out))


@pytest.mark.parametrize("flags, words", [
    (["--dp-noise-multiplier", "0"], ["dp_noise_multiplier is 0.0", "> 0"]),
    (["--dp-noise-multiplier", "1", "--dp-adaptive-quantile", "1.5"], ["dp_adaptive_quantile is 1.5", "(0, 1)"]),
    (["--dp-noise-multiplier", "1", "--dp-delta", "2"], ["dp_delta is 2.0"]),
    (["--dp-noise-multiplier", "1", "--dp-clip", "-1"], ["dp_clip is -1.0"]),
    (["--dp-clip", "1"], ["dp_clip is 1.0", "dp_noise_multiplier is unset"]),
    (["--dp-noise-multiplier", "1", "--dp-epsilon", "0.001"], ["dp_epsilon is 0.001", "a single update"]),
])
def test_bad_values_are_one_sentence(tmp_path, flags, words):
    out = tmp_path / "bad"
    refused(invoke("simulate", "--rounds", "1", "--clients", "6", "--clients-per-round", "3", "--backend", "local",
                   *flags, "--out", out), *words)
    assert not (out / "summary.json").exists() and not (out / "metrics.jsonl").exists()


def test_without_the_package_the_option_names_the_extra(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "dp_accounting", None)  # import dp_accounting raises ImportError
    refused(invoke("simulate", "--rounds", "1", "--backend", "local", "--dp-noise-multiplier", "1",
                   "--out", tmp_path / "x"), "dp-accounting", ".[privacy]")


def test_async_resume_with_adaptive_clipping_is_bit_for_bit(tmp_path):
    extra = ["--backend", "local", "--mode", "async", "--async-rule", "fedbuff", "--concurrency", "3", "--buffer-size",
             "2", "--devices", "lognormal", "--rounds", "4", "--dp-adaptive-quantile", "0.5", "--checkpoint-every", "1"]
    whole = run(tmp_path, "whole", *extra)
    out = tmp_path / "crashed"
    assert invoke(*RUN, *extra, "--fault-inject", "trainer-error@2", "--out", out).exit_code == 1
    resumed = invoke("simulate", "--out", out, "--resume", "--quiet")
    assert resumed.exit_code == 0, resumed.output
    assert summary(out)["params_sha256"] == summary(whole)["params_sha256"]
    keys = ("dp_epsilon", "dp_clip", "dp_unclipped_noised", "dp_updates")
    assert [[line[k] for k in keys] for line in lines(out)] == [[line[k] for k in keys] for line in lines(whole)]


def test_the_local_to_ray_handover_carries_the_privacy_state(tmp_path):
    """A run that starts in this process and hands over (here to a second local backend standing in for Ray,
    tests/engine/test_handoff.py's pattern) adds the noise and moves the clip as a run on one backend."""
    from tests.engine.test_handoff import StandIn
    from hasfl_ray.engine import Engine, RunConfig
    from hasfl_ray.engine.handoff import HandoffBackend

    config = dict(backend="local", rounds=4, clients=6, clients_per_round=3, seed=5, dp_noise_multiplier=1.1,
                  dp_clip=0.5, dp_adaptive_quantile=0.5)
    alone = Engine(RunConfig(**config), out_dir=str(tmp_path / "alone")).run()
    inner = StandIn()
    inner.go.set()
    handed = Engine(RunConfig(**config), out_dir=str(tmp_path / "handed"),
                    backend=HandoffBackend(lambda: inner, {"backend": "stand-in"}, takeover_round=2)).run()
    assert inner.rounds == [2, 3]
    assert handed["params_sha256"] == alone["params_sha256"] and handed["dp_epsilon"] == alone["dp_epsilon"]
    keys = ("dp_clip", "dp_unclipped_noised", "dp_updates")
    assert [[line[k] for k in keys] for line in lines(tmp_path / "handed")] == \
        [[line[k] for k in keys] for line in lines(tmp_path / "alone")]


def test_a_clocked_round_is_accounted_without_amplification(tmp_path):
    """On the device clock availability decides who is invited, not a uniform draw: no sampling amplification."""
    out = run(tmp_path, "clocked", "--backend", "local", "--devices", "lognormal", "--rounds", "2")
    accountant = dp_accounting.rdp.RdpAccountant(neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE)
    accountant.compose(dp_accounting.GaussianDpEvent(1.1 / 2), 2)
    assert lines(out)[-1]["dp_epsilon"] == accountant.get_epsilon(6 ** -1.1)
    assert summary(out)["dp_sampling"].startswith("none")
