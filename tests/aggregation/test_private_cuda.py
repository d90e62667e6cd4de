"""The CUDA kernel of the private ops (csrc/cuda/aggregate_private_cuda.cu: hasfl_ray::aggregate_private_into and
aggregate_private_sparse_into on CUDA) against the float64 oracles of the CPU op's tests, every layout: leading slices
(nested, boxes), rolling windows, gate blocks, index sets, masks, the label split with its uncounted rows; fixed-size
and Poisson. And against the CPU op: the draws bit for bit (one definition, csrc/private_normal.h), the output and
k_j bit for bit where nothing is clipped, to rounding where something is; the server's routing of a CUDA server.
Skipped without a GPU; benchmarks/gpu_check.sh runs them where a card is lent."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

import test_private_fused as dense_case
import test_private_fused_label_split as label_case
import test_private_fused_sparse as sparse_case
from hasfl_ray.aggregation.label_split import split_by_label
from hasfl_ray.aggregation.packed import to_device
from hasfl_ray.aggregation.windows import element_starts
from hasfl_ray.aggregation.privacy import PrivacySettings, noise_key
from hasfl_ray.engine import server_privacy
from hasfl_ray.models.slicing import gate_blocks_of
from hasfl_ray.ops import aggregate_private as private
from test_sparse import edge_round, random_round

pytestmark = pytest.mark.skipif(not (torch.cuda.is_available() and private.cuda_available()), reason="needs CUDA")

KINDS = [("index",), ("mask",), ("slice", "index", "mask")]
DEVICE = "cuda"


def on_cuda(updates):
    return [{name: to_device(packed, "cuda") for name, packed in update.items()} for update in updates]


def cuda_federation(federation):
    return SimpleNamespace(**{**vars(federation), "updates": on_cuda(federation.updates)})


def assert_on_cuda(got):
    assert all(t.device.type == "cuda" for t in got.result.delta.values())
    assert got.norms.device.type == "cpu" and got.result.div_num.device.type == "cpu"


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("nested,rolling", dense_case.LAYOUTS, ids=dense_case.LAYOUT_IDS)
def test_dense_layouts_on_cuda_are_the_float64_oracle(dtype, nested, rolling):
    federation = dense_case.random_federation(seed=7, num_clients=9, dtype=dtype, nested=nested, rolling=rolling)
    bounds = dense_case._bounds(federation.updates)
    got = dense_case._run(cuda_federation(federation), bounds, federation.weights)
    assert_on_cuda(got)
    mean, div_num, div_den, covered, counts = dense_case._oracle(federation, bounds, federation.weights)
    tolerance = 1e-6 if dtype == torch.float32 else 1e-12
    scale = max(float(m.abs().max()) for m in mean.values() if m.numel())
    for name in federation.shapes:
        torch.testing.assert_close(got.result.delta[name].cpu().double(), mean[name], rtol=0, atol=tolerance * scale)
        assert torch.equal(got.counts[name].cpu(), counts[name]), name
    norm_scale = max(float(div_num.max()), float(div_den.max()))
    torch.testing.assert_close(got.result.div_num, div_num, rtol=1e-10, atol=1e-10 * norm_scale)
    torch.testing.assert_close(got.result.div_den, div_den, rtol=1e-10, atol=1e-10 * norm_scale)
    assert got.result.covered_fraction == pytest.approx(covered, abs=1e-15)
    torch.testing.assert_close(got.norms, torch.tensor([dense_case._norm(u) for u in federation.updates],
                                                       dtype=torch.float64), rtol=1e-12, atol=0)


@pytest.mark.parametrize("expected", [None, 4.5], ids=["fixed-size", "poisson"])
@pytest.mark.parametrize("kinds", KINDS, ids=["index", "mask", "mixed"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_sparse_layouts_on_cuda_are_the_float64_oracle(dtype, kinds, expected):
    shapes, updates, _, blocks = random_round(5 + len(kinds), 9, dtype, kinds)
    bounds = sparse_case.bounds_of(updates)
    got = private.aggregate_private_sparse(shapes, on_cuda(updates), [1.0] * 9, bounds, 0.6, 987654321, 3, expected,
                                           blocks)
    assert_on_cuda(got)
    want, counts = sparse_case.oracle(shapes, updates, blocks, bounds, 0.6, 987654321, 3, expected)
    tolerance = 2e-6 if dtype == torch.float32 else 1e-12
    for name in shapes:
        torch.testing.assert_close(got.result.delta[name].cpu().double(), torch.from_numpy(want[name]),
                                   rtol=tolerance, atol=tolerance)
        assert torch.equal(got.counts[name].cpu(), torch.from_numpy(counts[name])), name


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_sparse_edge_cases_on_cuda(dtype):
    shapes, updates, _, _ = edge_round(dtype)
    bounds = sparse_case.bounds_of(updates)
    got = private.aggregate_private_sparse(shapes, on_cuda(updates), [1.0] * len(updates), bounds, 0.4, 11, 0, None,
                                           {})
    want, counts = sparse_case.oracle(shapes, updates, {}, bounds, 0.4, 11, 0, None)
    tolerance = 2e-6 if dtype == torch.float32 else 1e-12
    for name in shapes:
        torch.testing.assert_close(got.result.delta[name].cpu().double(), torch.from_numpy(want[name]),
                                   rtol=tolerance, atol=tolerance)


def cuda_server(backend="auto"):
    srv = label_case.server(backend)
    srv.device = torch.device("cuda")
    return srv


@pytest.mark.parametrize("expected", [None, 3.5], ids=["fixed-size", "poisson"])
@pytest.mark.parametrize("windows", [False, True], ids=["slices", "windows"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_label_split_on_a_cuda_server_is_the_float64_oracle(dtype, windows, expected):
    updates, offsets, holds = label_case.federation(dtype, 7, windows, 1)
    clients = [0, 1, 2, 3, 3, 4, 5]
    clip = label_case.clip_of(updates)
    srv = cuda_server()
    assert server_privacy.fused_form(srv, on_cuda(updates), offsets, holds) is not None  # the CUDA kernel's
    assert server_privacy.fused_form(cuda_server("reference"), on_cuda(updates), offsets, holds) is None  # fallback
    got = label_case.private_mean(srv, on_cuda(updates), offsets, holds, clients, clip, expected)
    key = noise_key(PrivacySettings(noise_multiplier=0.7, clip=clip, seed=23))
    want, div_num, div_den = label_case.oracle(updates, offsets, holds, clients, clip, 0.7, key, 4, expected)
    tolerance = 2e-6 if dtype == torch.float32 else 1e-12
    for name in label_case.SPECS:
        assert got.delta[name].device.type == DEVICE
        torch.testing.assert_close(got.delta[name].cpu().double(), want[name][0], rtol=tolerance, atol=tolerance)
    torch.testing.assert_close(got.div_num.cpu(), div_num, rtol=1e-5 if dtype == torch.float32 else 1e-11,
                               atol=1e-12)


def test_the_draws_are_the_cpu_ops_bit_for_bit():
    """One client holding every coordinate with value 0 and no clip: each output is its draw times std, alone."""
    shapes = {"a": (3, 700), "b": (129,), "c": (5, 2, 33)}
    zeros = [{name: torch.zeros(shape, dtype=torch.float64) for name, shape in shapes.items()}]
    for expected in (None, 1.0):
        cpu = private.aggregate_private(shapes, zeros, [1.0], [math.inf], 1.0, 2 ** 62 + 99, 17, expected)
        gpu = private.aggregate_private(shapes, on_cuda(zeros), [1.0], [math.inf], 1.0, 2 ** 62 + 99, 17, expected)
        draws = private.normals(2 ** 62 + 99, 17, sum(math.prod(s) for s in shapes.values()))
        assert torch.equal(torch.cat([gpu.result.delta[n].cpu().flatten() for n in shapes]), draws)
        for name in shapes:
            assert torch.equal(gpu.result.delta[name].cpu(), cpu.result.delta[name]), name


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_unclipped_cuda_equals_the_cpu_op_bit_for_bit_and_clipped_to_rounding(dtype):
    shapes, updates, _, blocks = random_round(13, 8, dtype, ("slice", "index", "mask"))
    for bounds, exact in (([math.inf] * 8, True), (sparse_case.bounds_of(updates), False)):
        cpu = private.aggregate_private_sparse(shapes, updates, [1.0] * 8, bounds, 0.5, 77, 1, None, blocks)
        gpu = private.aggregate_private_sparse(shapes, on_cuda(updates), [1.0] * 8, bounds, 0.5, 77, 1, None, blocks)
        for name in shapes:
            assert torch.equal(gpu.counts[name].cpu(), cpu.counts[name]), name
            if exact:
                assert torch.equal(gpu.result.delta[name].cpu(), cpu.result.delta[name]), name
            else:
                tolerance = 2e-6 if dtype == torch.float32 else 1e-12
                torch.testing.assert_close(gpu.result.delta[name].cpu(), cpu.result.delta[name], rtol=tolerance,
                                           atol=tolerance)
        torch.testing.assert_close(gpu.norms, cpu.norms, rtol=1e-13, atol=0)
        torch.testing.assert_close(gpu.result.div_num, cpu.result.div_num, rtol=1e-10, atol=1e-12)


def test_the_label_splits_uncounted_rows_on_cuda_equal_the_cpu_op():
    updates, offsets, holds = label_case.federation(torch.float64, 9, True, 4)
    shapes = {n: s.shape for n, s in label_case.SPECS.items()}
    blocks = gate_blocks_of(label_case.SPECS)
    starts = element_starts(label_case.SPECS, updates, offsets)
    results = []
    for device_updates in (updates, on_cuda(updates)):
        split, aside = split_by_label(label_case.SPECS, device_updates, offsets, holds, label_case.OUTPUT)
        results.append(private.aggregate_private_sparse(shapes, split, [1.0] * 9, [math.inf] * 9, 0.9, 5, 2, None,
                                                        blocks, starts, aside))
    cpu, gpu = results
    for name in shapes:
        assert torch.equal(gpu.result.delta[name].cpu(), cpu.result.delta[name]), name
        assert torch.equal(gpu.counts[name].cpu(), cpu.counts[name]), name
    torch.testing.assert_close(gpu.result.div_num, cpu.result.div_num, rtol=1e-12, atol=1e-14)


def test_cuda_is_deterministic():
    shapes, updates, _, blocks = random_round(5, 9, torch.float32)
    bounds = sparse_case.bounds_of(updates)
    runs = [private.aggregate_private_sparse(shapes, on_cuda(updates), [1.0] * 9, bounds, 0.3, 9, 2, None, blocks)
            for _ in range(2)]
    for name in shapes:
        assert torch.equal(runs[0].result.delta[name], runs[1].result.delta[name])
    assert torch.equal(runs[0].result.div_num, runs[1].result.div_num)
    assert torch.equal(runs[0].norms, runs[1].norms)
