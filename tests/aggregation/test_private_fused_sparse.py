"""Index sets and masks through the fused DP op (hasfl_ray::aggregate_private_sparse_into,
hasfl_ray.ops.aggregate_private.aggregate_private_sparse): clip over each client's packed values, the count-weighted
mean over each coordinate's holders, k_j and the noise keyed by the coordinate's index in the model, in one pass beside
slices. Checked against a float64 dense oracle written with numpy (mixed shapes in one round: slices, per-dim index
sets, masks, gate blocks, rows of several tiles, a scalar), across threads, against the server's torch path, and in
whole DP runs of FLuID (index sets) and FIARSE (masks): local and Ray, and a resume, give one params_sha256."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from hasfl_ray.aggregation.privacy import PrivacySettings, noise_key
from hasfl_ray.engine import server_privacy
from hasfl_ray.engine.server import Server
from hasfl_ray.ops import aggregate_private as private
from test_sparse import edge_round, numpy_mask, random_round
from tests.engine.run_outputs import assert_resume_and_ray_equal, run_into, summary
import importlib.util

#: a DP run accounts epsilon, which needs the privacy extra (dp-accounting; the GPU machine of 2026-11-29 lacked it)
needs_accounting = pytest.mark.skipif(importlib.util.find_spec("dp_accounting") is None,
                                      reason="needs the privacy extra (dp-accounting): a DP run accounts epsilon")

pytestmark = pytest.mark.skipif(not private.sparse_available(),
                                reason="needs hasfl_ray._C built with aggregate_private_sparse_into")


def values(packed):
    return packed if isinstance(packed, torch.Tensor) else packed.values


def norm(update):
    return math.sqrt(sum(float(values(t).double().square().sum()) for t in update.values()))


def bounds_of(updates):
    """Bounds that clip some clients and not others (one unbounded)."""
    middle = sorted(norm(u) for u in updates)[len(updates) // 2]
    return [math.inf if i == 0 else middle * (0.5 + 0.25 * (i % 3)) for i in range(len(updates))]


def oracle(shapes, updates, blocks, bounds, std, key, offset, expected):
    """Dense float64 with numpy: each update clipped, scattered by its own mask; S_j, k_j; the noised mean."""
    total = sum(math.prod(s) for s in shapes.values())
    xi_all = private.normals(key, offset, total).numpy() * std
    out, counts, start = {}, {}, 0
    for name, full in shapes.items():
        s, k = np.zeros(full), np.zeros(full)
        for update, bound in zip(updates, bounds):
            if name not in update:
                continue
            factor = min(1.0, bound / norm(update))
            mask = numpy_mask(full, update[name], blocks.get(name, 1))
            dense = np.zeros(full)
            dense[mask] = values(update[name]).double().numpy().ravel() * factor  # row-major over the held ones
            s += dense
            k += mask
        n = math.prod(full)
        xi = xi_all[start:start + n].reshape(full)
        start += n
        if expected is None:
            out[name] = np.where(k > 0, (s + xi) / np.where(k > 0, k, 1), 0.0)
        else:
            out[name] = np.asarray((s + xi) / expected)
        counts[name] = k
    return out, counts


KINDS = [("index",), ("mask",), ("slice", "index", "mask")]


@pytest.mark.parametrize("expected", [None, 4.5], ids=["fixed-size", "poisson"])
@pytest.mark.parametrize("kinds", KINDS, ids=["index", "mask", "mixed"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_sparse_fused_form_is_the_float64_oracle(dtype, kinds, expected):
    shapes, updates, _, blocks = random_round(5 + len(kinds), 9, dtype, kinds)
    bounds = bounds_of(updates)
    std, key, offset = 0.6, 987654321, 3
    got = private.aggregate_private_sparse(shapes, updates, [1.0] * 9, bounds, std, key, offset, expected, blocks)
    want, counts = oracle(shapes, updates, blocks, bounds, std, key, offset, expected)
    tolerance = 2e-6 if dtype == torch.float32 else 1e-12
    assert list(got.result.delta) == list(shapes)
    for name in shapes:
        assert got.result.delta[name].dtype == dtype
        torch.testing.assert_close(got.result.delta[name].double(), torch.from_numpy(want[name]),
                                   rtol=tolerance, atol=tolerance)
        assert torch.equal(got.counts[name], torch.from_numpy(counts[name])), name
    torch.testing.assert_close(got.norms, torch.tensor([norm(u) for u in updates], dtype=torch.float64),
                               rtol=1e-12, atol=0)
    flat = np.concatenate([c.ravel() for c in counts.values()])
    assert (flat == 0).any() and (flat > 1).any()  # uncovered coordinates and shared ones both occur
    assert got.result.covered_fraction == pytest.approx(float((flat > 0).mean()), abs=1e-15)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_edge_cases_empty_sets_full_and_empty_masks_and_partial_words(dtype):
    shapes, updates, _, _ = edge_round(dtype)
    n = len(updates)
    bounds = bounds_of(updates)
    got = private.aggregate_private_sparse(shapes, updates, [1.0] * n, bounds, 0.4, 11, 0, None, {})
    want, counts = oracle(shapes, updates, {}, bounds, 0.4, 11, 0, None)
    tolerance = 2e-6 if dtype == torch.float32 else 1e-12
    for name in shapes:
        torch.testing.assert_close(got.result.delta[name].double(), torch.from_numpy(want[name]),
                                   rtol=tolerance, atol=tolerance)
        assert torch.equal(got.counts[name], torch.from_numpy(counts[name])), name


def test_bit_identical_with_one_and_two_threads():
    shapes, updates, _, blocks = random_round(4, 11, torch.float32)
    bounds = bounds_of(updates)
    before = torch.get_num_threads()
    runs = []
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            runs.append(private.aggregate_private_sparse(shapes, updates, [1.0] * 11, bounds, 0.3, 9, 2, None,
                                                         blocks))
    finally:
        torch.set_num_threads(before)
    for name in shapes:
        assert torch.equal(runs[0].result.delta[name], runs[1].result.delta[name]), name
    assert torch.equal(runs[0].result.div_num, runs[1].result.div_num)
    assert torch.equal(runs[0].result.div_den, runs[1].result.div_den)


def server(shapes, blocks, backend="auto"):
    ns = SimpleNamespace(shapes=shapes, gate_blocks=blocks, device=torch.device("cpu"), aggregation_backend=backend,
                         estimator="unbiased", specs={}, output_layer=None)
    ns._aggregate = lambda *args: Server._aggregate(ns, *args)  # the server's own routing (sparse: the fused kernel)
    return ns


@pytest.mark.parametrize("expected", [None, 4.5], ids=["fixed-size", "poisson"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_servers_sparse_fused_form_equals_its_torch_path_to_rounding(dtype, expected):
    """The same draws at the same coordinates: the two differ by rounding only (the op clips in float64 without
    rounding the clipped update to the clients' dtype)."""
    shapes, updates, _, blocks = random_round(21, 7, dtype)
    clients = [0, 1, 2, 2, 3, 4, 5]  # a repeated client: bound C / 2
    clip = sorted(norm(u) for u in updates)[3] * 0.9
    results = []
    for backend in ("auto", "reference"):
        srv = server(shapes, blocks, backend)
        srv.privacy = PrivacySettings(noise_multiplier=0.8, clip=clip, seed=5, updates=1, expected=expected)
        form = server_privacy.fused_form(srv, updates, [0] * 7, None)
        assert (form is None) == (backend == "reference")
        results.append(server_privacy.private_mean(srv, updates, [0] * 7, None, clients))
    fused, torch_path = results
    tolerance = 2e-6 if dtype == torch.float32 else 1e-12
    for name in shapes:
        torch.testing.assert_close(fused.delta[name], torch_path.delta[name], rtol=tolerance, atol=tolerance)
    torch.testing.assert_close(fused.div_num, torch_path.div_num, rtol=1e-5 if dtype == torch.float32 else 1e-10,
                               atol=1e-12)
    srv = server(shapes, blocks)
    assert server_privacy.fused_form(srv, updates, [1] * 7, None) is None  # windows beside index sets: refused there
    srv.estimator = "common-core"
    assert server_privacy.fused_form(srv, updates, [0] * 7, None) is None  # refused by the round's own path
    key = noise_key(PrivacySettings(noise_multiplier=0.8, clip=clip, seed=5))
    want, _ = oracle(shapes, updates, blocks, [clip / clients.count(c) for c in clients], 0.8 * clip, key, 1, expected)
    for name in shapes:
        torch.testing.assert_close(fused.delta[name].double(), torch.from_numpy(want[name]), rtol=tolerance,
                                   atol=tolerance)


RUN = ["simulate", "--rounds", "3", "--quiet", "--checkpoint-every", "1", "--dp-noise-multiplier", "1.1", "--dp-clip",
       "0.5"]
# FLuID's stragglers train index sets from the source's rnd 3 on (every client a round, so they take part); FIARSE
# trains masks every round
ALGORITHMS = {"fluid": ["--clients", "4", "--clients-per-round", "4", "--seed", "3"],
              "fiarse": ["--clients", "6", "--clients-per-round", "3"]}


@needs_accounting
@pytest.mark.parametrize("algorithm, sparse_rounds", [("fluid", 1), ("fiarse", 3)])
def test_a_dp_run_of_index_sets_or_masks_goes_through_the_op_and_ray_and_resume_agree(tmp_path, monkeypatch,
                                                                                         ray_shared, algorithm,
                                                                                         sparse_rounds):
    calls = []
    for op in ("aggregate_private", "aggregate_private_sparse"):
        monkeypatch.setattr(private, op, lambda *a, _op=getattr(private, op), _name=op, **k: calls.append(_name) or
                            _op(*a, **k))
    run = [*RUN, "--algorithm", algorithm, *ALGORITHMS[algorithm]]
    local = run_into(run, tmp_path, "local", "--backend", "local")
    assert len(calls) == 3 and calls.count("aggregate_private_sparse") == sparse_rounds  # one fused pass a round
    assert summary(local)["dp_updates"] == 3
    assert_resume_and_ray_equal(run, tmp_path, local, ray_shared)
