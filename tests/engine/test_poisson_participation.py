"""Poisson participation (``--participation poisson``, docs/privacy.md): each client joins a round independently at
rate q = clients_per_round / clients from the round's seeded stream; under DP the ε is dp-accounting's own
Poisson-sampled Gaussian (add-or-remove), the mean is over the public q·N, a round nobody joins still releases its
noise, and the local and Ray backends agree bit for bit. Bad values are one sentence."""

from __future__ import annotations

import functools
import math

import numpy as np
import pytest
import torch

from hasfl_ray.training.seeding import STREAM_PRIVACY, poisson_participants, stream_seed
from tests.cli.sentences import invoke, refused
from tests.engine.run_outputs import lines, run_into, summary

# seed 45 with 6 clients at q = 1/3: round 0 has participants, rounds 1 and 2 none (asserted below)
RUN = ["simulate", "--rounds", "3", "--clients", "6", "--clients-per-round", "2", "--seed", "45", "--quiet",
       "--participation", "poisson"]
DP = ["--dp-noise-multiplier", "1.1", "--dp-clip", "0.5"]
run = functools.partial(run_into, RUN)


def test_poisson_participants_are_seeded_independent_draws():
    rounds = [poisson_participants(7, t, 20, 5) for t in range(4000)]
    assert rounds[:50] == [poisson_participants(7, t, 20, 5) for t in range(50)]  # a function of (seed, round)
    assert rounds[:50] != [poisson_participants(8, t, 20, 5) for t in range(50)]
    sizes = np.array([len(r) for r in rounds])
    assert (sizes == 0).any() and (sizes > 5).any() and (sizes < 5).any()  # not a fixed-size draw
    # mean size q·N = 5 (std of the mean over 4000 rounds ~0.027) and each client's rate q = 1/4 (std ~0.007)
    assert abs(sizes.mean() - 5) < 0.15
    rate = np.bincount(np.concatenate([np.asarray(r, dtype=int) for r in rounds]), minlength=20) / len(rounds)
    assert np.all(np.abs(rate - 0.25) < 0.04)
    assert all(r == sorted(set(r)) for r in rounds)
    assert [t for t in range(3) if not poisson_participants(45, t, 6, 2)] == [1, 2]  # RUN's empty rounds


def own_poisson(accountant, z, q, steps, delta):
    relation = dp_accounting().NeighboringRelation.ADD_OR_REMOVE_ONE
    kinds = {"rdp": dp_accounting().rdp.RdpAccountant, "pld": dp_accounting().pld.PLDAccountant}
    own = kinds[accountant](neighboring_relation=relation)
    own.compose(dp_accounting().PoissonSampledDpEvent(q, dp_accounting().GaussianDpEvent(z)), steps)
    return own.get_epsilon(delta)


def dp_accounting():
    return pytest.importorskip("dp_accounting", reason="the privacy extra (dp-accounting) is not installed")


@pytest.mark.parametrize("accountant", ["rdp", "pld"])
def test_poisson_epsilon_is_dp_accountings_own(accountant):
    from hasfl_ray.config import RunConfig
    from hasfl_ray.engine import privacy

    config = RunConfig(clients=100, clients_per_round=10, dp_noise_multiplier=1.3, dp_accountant=accountant,
                       dp_delta=1e-5, participation="poisson")
    for steps in (1, 7):
        assert privacy.epsilon(config, steps) == own_poisson(accountant, 1.3, 0.1, steps, 1e-5)
    fixed = RunConfig(clients=100, clients_per_round=10, dp_noise_multiplier=1.3, dp_accountant=accountant,
                      dp_delta=1e-5)
    assert privacy.epsilon(config, 7) < privacy.epsilon(fixed, 7)  # add-or-remove (sensitivity C) and amplified
    assert privacy.sampling_of(config).startswith("Poisson")


def test_the_noised_sum_is_over_the_expected_participants():
    """(Σ_i clip(u_i) + ξ) / (q N) at every coordinate, uncovered ones included, against a float64 oracle written
    from zero-padded dense tensors; a round without updates releases ξ / (q N)."""
    from hasfl_ray.aggregation import aggregate_updates
    from hasfl_ray.aggregation.privacy import PrivacySettings, privatize

    shapes = {"w": (6, 4), "b": (6,)}
    g = torch.Generator().manual_seed(3)
    updates = [{"w": torch.randn(r, 4, generator=g, dtype=torch.float64) * 3, "b": torch.randn(r, generator=g,
                                                                                              dtype=torch.float64)}
               for r in (5, 3, 2)]  # nobody holds row 5

    def mean_of(ups, extra):
        return aggregate_updates(shapes, ups, [1.0] * len(ups), backend="reference")

    def oracle(ups, clip, z, key, expected):
        total = {n: torch.zeros(s, dtype=torch.float64) for n, s in shapes.items()}
        for u in ups:
            factor = min(1.0, clip / math.sqrt(sum(float((t ** 2).sum()) for t in u.values())))
            for n, t in u.items():
                total[n][:t.shape[0]] += t * factor
        from hasfl_ray.aggregation.philox import philox_normals

        draws = philox_normals(stream_seed(11, STREAM_PRIVACY), key, 30)  # coordinate j: its index in the flat model
        noise = {"w": draws[:24].view(6, 4) * z * clip, "b": draws[24:].view(6) * z * clip}
        return {n: (total[n] + noise[n]) / expected for n in shapes}

    settings = PrivacySettings(noise_multiplier=0.7, clip=1.5, seed=11, updates=4, expected=2.5)
    aggregate, keys = privatize(mean_of, shapes, updates, [0, 1, 2], settings)
    want = oracle(updates, 1.5, 0.7, 4, 2.5)
    for name in shapes:
        torch.testing.assert_close(aggregate.delta[name], want[name], rtol=1e-12, atol=1e-12)
    assert bool((aggregate.delta["b"][5] != 0)) and keys["dp_updates"] == 5

    def nothing(ups, extra):
        assert not ups
        return mean_of([{n: torch.zeros(s, dtype=torch.float64) for n, s in shapes.items()}], extra)
    empty, keys = privatize(nothing, shapes, [], [], settings)
    want = oracle([], 1.5, 0.7, 5, 2.5)
    for name in shapes:
        torch.testing.assert_close(empty.delta[name], want[name], rtol=1e-12, atol=1e-12)
    assert keys["dp_updates"] == 6 and keys["dp_clipped"] == 0


@pytest.fixture(scope="module")
def local_dp(tmp_path_factory):
    dp_accounting()
    return run(tmp_path_factory.mktemp("poisson"), "local", "--backend", "local", *DP)


def test_a_dp_run_accounts_every_round_and_noises_the_empty_ones(local_dp):
    history = lines(local_dp)
    assert [line["dp_updates"] for line in history] == [1, 2, 3]  # rounds 1 and 2 had nobody: noise alone
    for line in history:
        assert line["dp_epsilon"] == own_poisson("rdp", 1.1, 2 / 6, line["dp_updates"], 6 ** -1.1)
    assert [line["avg_p"] for line in history][1:] == [0.0, 0.0]
    losses = [line["test_loss"] for line in history]
    assert losses[0] != losses[1] != losses[2]  # the noise moved the model in the empty rounds
    assert summary(local_dp)["dp_sampling"].startswith("Poisson")


def test_without_dp_an_empty_round_leaves_the_model(tmp_path):
    out = run(tmp_path, "plain", "--backend", "local")
    history = lines(out)
    assert history[0]["test_loss"] == history[1]["test_loss"] == history[2]["test_loss"]  # rounds 1, 2: nobody
    assert [line["avg_p"] for line in history][1:] == [0.0, 0.0] and history[0]["avg_p"] > 0
    assert not [k for line in history for k in line if k.startswith("dp_")]


def test_local_and_ray_agree_bit_for_bit(tmp_path, local_dp):
    pytest.importorskip("ray", reason="needs Ray")
    ray_run = run(tmp_path, "ray", "--backend", "ray", "--actors", "1", *DP)
    assert summary(ray_run)["params_sha256"] == summary(local_dp)["params_sha256"]
    keys = ("dp_epsilon", "dp_clip", "dp_clipped", "dp_updates", "test_loss")
    assert [[line[k] for k in keys] for line in lines(ray_run)] == [[line[k] for k in keys] for line in lines(local_dp)]


@pytest.mark.parametrize("flags, words", [
    (["--mode", "async", "--devices", "lognormal"],
     ["participation is 'poisson'", "mode is 'async'", "expected participation fixed"]),
    (["--devices", "lognormal"], ["participation is 'poisson'", "devices is set"]),
])
def test_bad_values_are_one_sentence(tmp_path, flags, words):
    out = tmp_path / "bad"
    refused(invoke("simulate", "--rounds", "1", "--clients", "6", "--clients-per-round", "3", "--backend", "local",
                   "--participation", "poisson", *flags, "--out", out), *words)
    assert not out.exists() or not any(out.iterdir())


def test_a_bad_participation_in_a_config_file_is_one_sentence(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text("participation: binomial\n")
    refused(invoke("simulate", "--config", config, "--rounds", "1", "--backend", "local", "--out", tmp_path / "x"),
            "participation is 'binomial'", "fixed", "poisson")


def test_resume_is_bit_for_bit(tmp_path):
    """A run stopped in round 3 (after the empty rounds 1 and 2) and resumed (the Poisson draws, the empty rounds'
    noise and ε recomputed from the seed and the update count) ends where the uninterrupted run ends."""
    extra = ["--backend", "local", *DP, "--rounds", "4", "--checkpoint-every", "1"]
    assert len(poisson_participants(45, 3, 6, 2)) == 2
    whole = run(tmp_path, "whole", *extra)
    out = tmp_path / "crashed"
    crashed = invoke(*RUN, *extra, "--fault-inject", "trainer-error@3", "--out", out)
    assert crashed.exit_code == 1, crashed.output
    assert len(lines(out)) == 3
    resumed = invoke("simulate", "--out", out, "--resume", "--quiet")
    assert resumed.exit_code == 0, resumed.output
    assert summary(out)["params_sha256"] == summary(whole)["params_sha256"]
    keys = ("dp_epsilon", "dp_updates", "test_loss")
    assert [[line[k] for k in keys] for line in lines(out)] == [[line[k] for k in keys] for line in lines(whole)]
    assert [line["dp_updates"] for line in lines(whole)] == [1, 2, 3, 4]


def test_a_flower_strategy_refuses_poisson_participation():
    """Its rounds draw clients_per_round of the connected clients: refused before Flower is needed, not ignored."""
    from hasfl_ray import flower
    from hasfl_ray.errors import ConfigError

    with pytest.raises(ConfigError) as refused:
        flower.Strategy("fedavg", {"dataset": "digits", "clients": 6, "clients_per_round": 3, "rounds": 2},
                        participation="poisson")
    message = str(refused.value)
    assert len(message.splitlines()) == 1 and len(message) < 200
    assert "participation is 'poisson'" in message and "expected fixed" in message


def test_an_algorithm_that_selects_refuses_poisson_participation(tmp_path):
    """A plug-in's select would be ignored by the Poisson draw: refused before anything is written."""
    path = tmp_path / "plugin.py"
    path.write_text("from hasfl_ray.algorithms.base import Algorithm\n\nclass Picky(Algorithm):\n"
                    "    def select(self, round, available, k):\n        return list(available)[:k]\n")
    out = tmp_path / "run"
    refused(invoke(*RUN, "--backend", "local", "--algorithm", f"{path}:Picky", "--out", out),
            "participation is 'poisson'", "'Picky'", "chooses its own participants")
    assert not (out / "metrics.jsonl").exists() and not (out / "config.yaml").exists()


@pytest.mark.parametrize("algorithm", ["hasfl", "heterofl", "fjord", "uniform", "random-budget", "fedavg", "fedprox",
                                       "scaffold", "fedrolex", "fluid"])
def test_every_algorithm_runs_through_noised_empty_rounds(tmp_path, algorithm):
    """Rounds 1 and 2 have no participant: every algorithm observes the noise-only update and goes on."""
    dp_accounting()
    extra = ["--classifier-aggregation", "label_split"] if algorithm == "heterofl" else []  # the label holders' path
    out = run(tmp_path, algorithm, "--backend", "local", *DP, "--rounds", "4", "--algorithm", algorithm, *extra)
    assert [line["dp_updates"] for line in lines(out)] == [1, 2, 3, 4]
    assert [line["avg_p"] == 0.0 for line in lines(out)] == [False, True, True, False]
