"""The CUDA kernel of index sets and masks (csrc/cuda/aggregate_sparse_cuda.cu) against the float64 dense masked
oracle of test_sparse.py: index sets, masks and slices mixed in one call, float32 and float64, and the edge cases
(an empty index set, an all-false mask, an all-true mask, a mask ending mid-word and mid-tile, one client, a row
wider than a 128-column tile); and `bench aggregate --layout index|mask|depth --device cuda`. Skipped without a
GPU; benchmarks/gpu_check.sh runs them (it runs tests/aggregation) where a card is lent."""

import json

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from hasfl_ray.aggregation import aggregate_updates
from hasfl_ray.aggregation.packed import to_device
from hasfl_ray.ops import aggregate as ops
from test_sparse import assert_matches, edge_round, oracle, random_round

pytestmark = pytest.mark.skipif(not (torch.cuda.is_available() and ops.available() and ops.cuda_available()),
                                reason="needs CUDA")


def on_cuda(updates):
    return [{name: to_device(packed, "cuda") for name, packed in update.items()} for update in updates]


def check(shapes, updates, weights, blocks, dtype, backend="fused"):
    result = aggregate_updates(shapes, on_cuda(updates), weights, blocks, backend=backend)
    assert all(t.device.type == "cuda" for t in result.delta.values())
    cpu = type(result)({n: t.cpu() for n, t in result.delta.items()}, result.div_num.cpu(), result.div_den.cpu(),
                       result.covered_fraction)
    assert_matches(cpu, oracle(shapes, updates, weights, blocks), dtype)
    return result


@pytest.mark.parametrize("backend", ["fused", "auto"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("kinds", [("index",), ("mask",), ("slice", "index", "mask")], ids=["index", "mask", "mixed"])
@pytest.mark.parametrize("num_clients", [1, 3, 11])
def test_sparse_cuda_matches_dense_oracle(backend, dtype, kinds, num_clients):
    shapes, updates, weights, blocks = random_round(7 * num_clients + len(kinds), num_clients, dtype, kinds)
    check(shapes, updates, weights, blocks, dtype, backend)


def test_sparse_cuda_is_deterministic():
    shapes, updates, weights, blocks = random_round(5, 9, torch.float32)
    first = aggregate_updates(shapes, on_cuda(updates), weights, blocks, backend="fused")
    second = aggregate_updates(shapes, on_cuda(updates), weights, blocks, backend="fused")
    for name in shapes:
        assert torch.equal(first.delta[name], second.delta[name])
    assert torch.equal(first.div_num, second.div_num) and torch.equal(first.div_den, second.div_den)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_sparse_cuda_edge_cases(dtype):
    shapes, updates, weights, blocks = edge_round(dtype)
    check(shapes, updates, weights, blocks, dtype)
    check(shapes, updates[:1], weights[:1], blocks, dtype)  # one client, holding almost nothing


@pytest.mark.parametrize("layout", ["index", "mask", "depth"])
def test_bench_aggregate_layout_on_cuda(layout):
    from hasfl_ray.cli.main import main

    result = CliRunner().invoke(main, ["bench", "aggregate", "--models", "emnist", "--clients", "3", "--repeats", "1",
                                       "--skip-slow", "--layout", layout, "--device", "cuda", "--json"])
    assert result.exit_code == 0, result.output
    (case,) = json.loads(result.output.splitlines()[-1])
    assert case["layout"] == layout and case["device"] == "cuda"
    assert {"fused", "fused kernel"} <= {t["implementation"] for t in case["timings"]}


def test_layout_competitors_on_cuda_compute_the_same_result():
    from hasfl_ray.bench.layouts import make_layout_federation, torch_dense, torch_index_add

    for layout in ("index", "mask"):
        f = make_layout_federation("digits", 4, layout, dtype=torch.float64, device="cuda")
        expected = aggregate_updates(f.shapes, f.updates, f.weights, f.gate_blocks, backend="fused")
        for competitor in (torch_index_add, torch_dense):
            delta, div_num, div_den = competitor(f.shapes, f.updates, f.weights, f.gate_blocks)
            for name in f.shapes:
                torch.testing.assert_close(delta[name], expected.delta[name], rtol=1e-10, atol=1e-10)
            torch.testing.assert_close(div_num, expected.div_num, rtol=1e-9, atol=1e-9)
            torch.testing.assert_close(div_den, expected.div_den, rtol=1e-9, atol=1e-9)
    assert np.isfinite(float(expected.div_num.sum()))
