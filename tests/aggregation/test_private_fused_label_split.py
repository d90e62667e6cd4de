"""The label split (HeteroFL's and FedRolex's ``classifier_aggregation: label_split``) through the fused DP op
(server_privacy.label_split_form -> hasfl_ray::aggregate_private_sparse_into): the output layer's rows averaged over
the clients holding each label, each client clipped over every value it trained (rows of labels it does not hold
included, as privacy.update_norm counts them), k_j the label's holders covering j, the noise keyed by j's index in
the model. Checked against a float64 oracle written from window_linear_index and the label sets (random clients,
widths, label sets, leading slices and rolling windows, fixed-size and Poisson), its divergence norms over each
client's own coordinates, across threads, against the server's torch path, and in a DP HeteroFL run with label
split: one params_sha256 on local, Ray and a resume."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from hasfl_ray.aggregation.packed import IndexedUpdate
from hasfl_ray.aggregation.privacy import PrivacySettings, noise_key
from hasfl_ray.engine import server_privacy
from hasfl_ray.engine.server import Server
from hasfl_ray.models.slicing import DimSlice, ParamSpec, gate_blocks_of, window_linear_index
from hasfl_ray.ops import aggregate_private as private
from tests.engine.run_outputs import assert_resume_and_ray_equal, run_into, summary
import importlib.util

#: a DP run accounts epsilon, which needs the privacy extra (dp-accounting; the GPU machine of 2026-11-29 lacked it)
needs_accounting = pytest.mark.skipif(importlib.util.find_spec("dp_accounting") is None,
                                      reason="needs the privacy extra (dp-accounting): a DP run accounts epsilon")

pytestmark = pytest.mark.skipif(not private.sparse_available(),
                                reason="needs hasfl_ray._C built with aggregate_private_sparse_into")

CLASSES = 10
SPECS = {
    "conv.weight": ParamSpec("conv.weight", (DimSlice(8), DimSlice(3, scaled=False), DimSlice(3, scaled=False))),
    "conv.bias": ParamSpec("conv.bias", (DimSlice(8),)),
    "lstm.weight": ParamSpec("lstm.weight", (DimSlice(24, blocks=4), DimSlice(8))),
    "fc.weight": ParamSpec("fc.weight", (DimSlice(CLASSES, scaled=False), DimSlice(32, unit=4))),
    "fc.bias": ParamSpec("fc.bias", (DimSlice(CLASSES, scaled=False),)),
}
OUTPUT = ("fc.weight", "fc.bias")


def federation(dtype, clients, windows, seed):
    """Random widths, label sets (one client every label, one none), packed updates and offsets."""
    rng = np.random.default_rng(seed)
    generator = torch.Generator().manual_seed(seed)
    widths = rng.choice([0.25, 0.5, 0.75, 1.0], size=clients)
    holds = rng.random((clients, CLASSES)) < 0.4
    holds[0], holds[1] = True, False
    updates = [{name: torch.randn(spec.sliced_shape(float(p)), generator=generator, dtype=torch.float64).to(dtype)
                for name, spec in SPECS.items()} for p in widths]
    offsets = [int(o) for o in rng.integers(0, 40, size=clients)] if windows else [0] * clients
    return updates, offsets, holds


def server(backend="auto"):
    ns = SimpleNamespace(specs=SPECS, shapes={n: s.shape for n, s in SPECS.items()}, gate_blocks=gate_blocks_of(SPECS),
                         device=torch.device("cpu"), aggregation_backend=backend, estimator="unbiased",
                         output_layer=OUTPUT)
    ns._aggregate = lambda *args: Server._aggregate(ns, *args)  # the server's own routing (label split)
    return ns


def norm(update):
    return math.sqrt(sum(float(t.double().square().sum()) for t in update.values()))


def oracle(updates, offsets, holds, clients, clip, z, key, offset, expected):
    """Float64: clip over every packed value (C / repeats), scatter at window_linear_index, the output layer's rows
    only where the client holds the label; (S_j + ξ_j) / k_j (0 where k_j = 0) or / expected; the divergence norms of
    the clipped updates over all their own coordinates against the noiseless mean S_j / k_j."""
    total = sum(spec.numel() for spec in SPECS.values())
    draws = private.normals(key, offset, total) * (z * clip)
    factors = [min(1.0, clip / clients.count(c) / norm(u)) for u, c in zip(updates, clients)]
    out, means, start = {}, {}, 0
    for name, spec in SPECS.items():
        s = torch.zeros(spec.numel(), dtype=torch.float64)
        k = torch.zeros_like(s)
        for update, o, held, factor in zip(updates, offsets, holds, factors):
            flat = window_linear_index(spec, update[name].shape, o).flatten()
            counted = torch.ones(flat.numel(), dtype=torch.bool)
            if name in OUTPUT:
                counted = torch.as_tensor(held).view((-1,) + (1,) * (update[name].dim() - 1)).expand(
                    update[name].shape).flatten()
            s.index_add_(0, flat[counted], update[name].double().flatten()[counted] * factor)
            k.index_add_(0, flat[counted], torch.ones(int(counted.sum()), dtype=torch.float64))
        xi = draws[start:start + s.numel()]
        start += s.numel()
        means[name] = torch.where(k > 0, s / torch.where(k > 0, k, 1), 0)
        value = torch.where(k > 0, (s + xi) / torch.where(k > 0, k, 1), 0) if expected is None else (s + xi) / expected
        out[name] = (value.view(spec.shape), k.view(spec.shape))
    div_num = torch.zeros(len(updates), dtype=torch.float64)
    div_den = torch.zeros_like(div_num)
    for i, (update, o, factor) in enumerate(zip(updates, offsets, factors)):
        for name, spec in SPECS.items():
            at = means[name][window_linear_index(spec, update[name].shape, o).flatten()]
            div_num[i] += float((update[name].double().flatten() * factor - at).square().sum())
            div_den[i] += float(at.square().sum())
    return out, div_num, div_den


def private_mean(srv, updates, offsets, holds, clients, clip, expected, z=0.7, seed=23, done=4):
    srv.privacy = PrivacySettings(noise_multiplier=z, clip=clip, seed=seed, updates=done, expected=expected)
    return server_privacy.private_mean(srv, updates, offsets, holds, clients)


def clip_of(updates):
    return sorted(norm(u) for u in updates)[len(updates) // 2] * 0.9  # clips about half the clients


@pytest.mark.parametrize("expected", [None, 3.5], ids=["fixed-size", "poisson"])
@pytest.mark.parametrize("windows", [False, True], ids=["slices", "windows"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("seed", [1, 2])
def test_the_fused_label_split_is_the_float64_oracle(monkeypatch, dtype, windows, expected, seed):
    updates, offsets, holds = federation(dtype, 7, windows, seed)
    clients = [0, 1, 2, 3, 3, 4, 5]  # a repeated client: bound C / 2
    clip = clip_of(updates)
    calls = []
    op = private.aggregate_private_sparse
    monkeypatch.setattr(private, "aggregate_private_sparse", lambda *a, **k: calls.append(1) or op(*a, **k))
    got = private_mean(server(), updates, offsets, holds, clients, clip, expected)
    assert calls == [1]  # the one pass, not the torch path
    key = noise_key(PrivacySettings(noise_multiplier=0.7, clip=clip, seed=23))
    want, div_num, div_den = oracle(updates, offsets, holds, clients, clip, 0.7, key, 4, expected)
    tolerance = 2e-6 if dtype == torch.float32 else 1e-12
    assert list(got.delta) == list(SPECS)
    for name in SPECS:
        assert got.delta[name].dtype == dtype
        torch.testing.assert_close(got.delta[name].double(), want[name][0], rtol=tolerance, atol=tolerance)
    torch.testing.assert_close(got.div_num, div_num, rtol=1e-5 if dtype == torch.float32 else 1e-11, atol=1e-12)
    torch.testing.assert_close(got.div_den, div_den, rtol=1e-5 if dtype == torch.float32 else 1e-11, atol=1e-12)
    counts = {name: want[name][1] for name in SPECS}
    for name in OUTPUT:  # the label's holders only; some rows nobody holds
        assert got.covered_by_layer[name] == float((counts[name] > 0).double().mean())
    flat = torch.cat([c.flatten() for c in counts.values()])
    assert got.covered_fraction == pytest.approx(float((flat > 0).double().mean()), abs=1e-15)
    assert (counts["fc.bias"] == 0).any() or (counts["fc.bias"] < 7).all()


def test_the_ops_counts_are_the_label_holders():
    updates, offsets, holds = federation(torch.float64, 6, True, 5)
    from hasfl_ray.aggregation.label_split import split_by_label

    split, aside = split_by_label(SPECS, updates, offsets, holds, OUTPUT)
    assert [i for i, _ in aside] == [i for i in range(6) if not holds[i].all()]  # client 0 holds every label
    got = private.aggregate_private_sparse(server().shapes, split, [1.0] * 6, [math.inf] * 6, 0.0, 1, 0, None,
                                           gate_blocks_of(SPECS), None, aside)
    for name in OUTPUT:
        k = torch.zeros(SPECS[name].numel(), dtype=torch.float64)
        for update, o, held in zip(updates, offsets, holds):
            flat = window_linear_index(SPECS[name], update[name].shape, o)
            rows = torch.as_tensor(held).view((-1,) + (1,) * (flat.dim() - 1)).expand(flat.shape)
            k.index_add_(0, flat[rows], torch.ones(int(rows.sum()), dtype=torch.float64))
        assert torch.equal(got.counts[name].flatten(), k), name
    # the norms are over every packed value, the rows of labels a client does not hold included
    torch.testing.assert_close(got.norms, torch.tensor([norm(u) for u in updates], dtype=torch.float64),
                               rtol=1e-12, atol=0)


def test_bit_identical_with_one_and_two_threads():
    updates, offsets, holds = federation(torch.float32, 9, True, 3)
    clip = clip_of(updates)
    before = torch.get_num_threads()
    runs = []
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            runs.append(private_mean(server(), updates, offsets, holds, list(range(9)), clip, None))
    finally:
        torch.set_num_threads(before)
    for name in SPECS:
        assert torch.equal(runs[0].delta[name], runs[1].delta[name]), name
    assert torch.equal(runs[0].div_num, runs[1].div_num) and torch.equal(runs[0].div_den, runs[1].div_den)


@pytest.mark.parametrize("expected", [None, 3.5], ids=["fixed-size", "poisson"])
@pytest.mark.parametrize("windows", [False, True], ids=["slices", "windows"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_fused_label_split_equals_the_torch_path_to_rounding(dtype, windows, expected):
    """The same draws at the same coordinates, the same clip norms, k_j, divergence norms and coverage: the two
    differ by rounding only (the op clips in float64 and rounds the noised mean once)."""
    updates, offsets, holds = federation(dtype, 8, windows, 11)
    clip = clip_of(updates)
    fused = private_mean(server(), updates, offsets, holds, list(range(8)), clip, expected)
    reference = server("reference")
    assert server_privacy.fused_form(reference, updates, offsets, holds) is None  # the fallback switch
    torch_path = private_mean(reference, updates, offsets, holds, list(range(8)), clip, expected)
    tolerance = 2e-6 if dtype == torch.float32 else 1e-12
    for name in SPECS:
        torch.testing.assert_close(fused.delta[name], torch_path.delta[name], rtol=tolerance, atol=tolerance)
    torch.testing.assert_close(fused.div_num, torch_path.div_num, rtol=1e-5 if dtype == torch.float32 else 1e-10,
                               atol=1e-12)
    torch.testing.assert_close(fused.div_den, torch_path.div_den, rtol=1e-5 if dtype == torch.float32 else 1e-10,
                               atol=1e-12)
    assert fused.covered_fraction == torch_path.covered_fraction
    assert {n: fused.covered_by_layer[n] for n in OUTPUT} == {n: torch_path.covered_by_layer[n] for n in OUTPUT}


def test_index_sets_beside_a_label_split_keep_the_rounds_refusal():
    """The round cannot have both (Server._aggregate refuses it in a sentence): the fused form steps aside so the
    torch path reaches that refusal."""
    updates, offsets, holds = federation(torch.float64, 3, False, 7)
    updates[1]["conv.bias"] = IndexedUpdate(torch.randn(2, dtype=torch.float64), (torch.tensor([1, 5]),))
    assert server_privacy.fused_form(server(), updates, offsets, holds) is None
    with pytest.raises(ValueError, match="cannot be combined with label splits"):
        private_mean(server(), updates, offsets, holds, [0, 1, 2], 1.0, None)


RUN = ["simulate", "--rounds", "3", "--quiet", "--checkpoint-every", "1", "--dp-noise-multiplier", "1.1", "--dp-clip",
       "0.5", "--clients", "6", "--clients-per-round", "3", "--classifier-aggregation", "label_split"]


@needs_accounting
@pytest.mark.parametrize("algorithm", ["heterofl", "fedrolex"])
def test_a_dp_label_split_run_goes_through_the_op_and_ray_and_resume_agree(tmp_path, monkeypatch, ray_shared,
                                                                          algorithm):
    calls = []
    for op in ("aggregate_private", "aggregate_private_sparse"):
        monkeypatch.setattr(private, op, lambda *a, _op=getattr(private, op), _name=op, **k: calls.append(_name) or
                            _op(*a, **k))
    run = [*RUN, "--algorithm", algorithm]
    local = run_into(run, tmp_path, "local", "--backend", "local")
    assert calls == ["aggregate_private_sparse"] * 3  # one fused pass a round, the label split's
    assert summary(local)["dp_updates"] == 3
    assert_resume_and_ray_equal(run, tmp_path, local, ray_shared)
