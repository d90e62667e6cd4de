"""HAS-FL against the paper (hasfl-paper.tex), restated here independently: Algorithm 1's server side, lines 17-29
(coordinate-wise n_i-weighted mean over the covering clients, 0 where none covers; Ĥ_i of Eq. 5 on client i's own
coordinates; the EMA of Eq. 6 from H̃^(0) = 1 for the round's participants; the allocation rule of Eq. 7 with H̄ the
mean over all N clients; the coverage guarantee), Algorithm 2's nested masks (ceil(p·C) leading channels and their
input connections), Section 4.1's schedule (adaptation at the end of round t >= warm-up 10 with t mod T_adapt = 0)
and Section 3.2's periodic normalisation (every T_norm = 20 rounds all H̃ rescaled to mean 1: Figure 4 reads
1.000 at rounds 20, 40, ...), run for 56 rounds against hasfl-ray's aggregation and HAS-FL."""

import math

import numpy as np
import pytest
import torch

from algorithm_runs import small_config
from hasfl_ray.aggregation import aggregate_updates, fused_available
from hasfl_ray.algorithms.hasfl import HASFL
from hasfl_ray.training.local import ClientResult

N, S, ROUNDS = 20, 10, 56
C_IN, C_HIDDEN, CLASSES = 5, 16, 7  # a conv-like layer (C_HIDDEN x C_IN) and a classifier (CLASSES x C_HIDDEN)
SHAPES = {"w1": (C_HIDDEN, C_IN), "b1": (C_HIDDEN,), "w2": (CLASSES, C_HIDDEN), "b2": (CLASSES,)}
P_MIN, GAMMA, BETA, T_ADAPT, WARMUP, T_NORM, EPS = 0.4, 0.25, 0.9, 5, 10, 20, 1e-8  # Section 4.1; ε our default


def paper_mask(p):
    """Algorithm 2: the leading ceil(p·C) hidden channels, their input connections; inputs and classes unscaled."""
    kept = math.ceil(p * C_HIDDEN)
    m = {name: np.zeros(shape, dtype=bool) for name, shape in SHAPES.items()}
    m["w1"][:kept, :] = m["b1"][:kept] = m["w2"][:, :kept] = m["b2"][:] = True
    return m, kept


def paper_server(p, h, updates, masks, n, t, coverage, p_max):
    """Algorithm 1, lines 17-29, and the normalisation: the round's Δ̄, then the new (p, H̃)."""
    clients = sorted(updates)
    delta = {}
    for name in SHAPES:
        num = sum(n[i] * masks[i][name] * updates[i][name] for i in clients)
        den = sum(n[i] * masks[i][name] for i in clients)
        delta[name] = np.where(den > 0, num / np.where(den > 0, den, 1), 0.0)
    h, p = h.copy(), p.copy()
    if t >= WARMUP and t % T_ADAPT == 0:
        for i in clients:
            h_hat = sum(((masks[i][k] * (updates[i][k] - delta[k])) ** 2).sum() for k in SHAPES) / (
                sum(((masks[i][k] * delta[k]) ** 2).sum() for k in SHAPES) + EPS)
            h[i] = BETA * h[i] + (1 - BETA) * h_hat
        p = np.minimum(p_max, P_MIN + GAMMA * h / (h.mean() + EPS))
        if coverage:
            p[p_max == p_max.max()] = p_max.max()
    if t > 0 and t % T_NORM == 0:
        h = h / h.mean()
    return delta, p, h


@pytest.mark.parametrize("backend", ["reference", pytest.param("fused", marks=pytest.mark.skipif(
    not fused_available(), reason="needs the compiled extension hasfl_ray._C"))])
@pytest.mark.parametrize("coverage", [True, False])
def test_fifty_six_rounds_of_the_paper_server_equal_hasfl(coverage, backend):
    rng = np.random.default_rng(7)
    p_max = rng.choice([0.25, 0.5, 0.75, 1.0], size=N, p=[0.40, 0.25, 0.20, 0.15])
    p_max[0] = 1.0
    n = rng.integers(50, 500, size=N)
    config = small_config(clients=N, clients_per_round=S, algorithm_options={"coverage": coverage})
    ours = HASFL(config, p_max, n)
    p, h = p_max.copy(), np.ones(N)  # p^(0) = p^max, H̃^(0) = 1
    for t in range(ROUNDS):
        clients = sorted(int(i) for i in rng.choice(N, S, replace=False))
        assert ours.allocate(t, clients) == pytest.approx({i: p[i] for i in clients}, abs=1e-12)
        updates, masks, packed = {}, {}, []
        for i in clients:
            masks[i], kept = paper_mask(p[i])
            updates[i] = {k: rng.normal(0, 1 + i % 3, shape) * masks[i][k] for k, shape in SHAPES.items()}
            packed.append({"w1": torch.tensor(updates[i]["w1"][:kept]), "b1": torch.tensor(updates[i]["b1"][:kept]),
                           "w2": torch.tensor(updates[i]["w2"][:, :kept]), "b2": torch.tensor(updates[i]["b2"])})
        delta, p, h = paper_server(p, h, updates, masks, n, t, coverage, p_max)
        aggregate = aggregate_updates(SHAPES, packed, [float(n[i]) for i in clients], backend=backend)
        for name in SHAPES:
            np.testing.assert_allclose(aggregate.delta[name].numpy(), delta[name], rtol=1e-12, atol=1e-12)
        ours.observe(t, [ClientResult(i, float(p_max[i]), {}, int(n[i]), 0.0, 1) for i in clients], aggregate)
        np.testing.assert_allclose(ours.h_tilde(), h, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(ours.p_current, p, rtol=0, atol=1e-12)
    assert np.ptp(p[p_max > 0.25]) > 0 and abs(h.mean() - 1) > 1e-3  # the rule moved widths; H̃ drifted since t=40
    assert (p[p_max == 1.0] == 1.0).all() if coverage else (p < 1.0).all()
