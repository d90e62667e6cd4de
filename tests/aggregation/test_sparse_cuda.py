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

from hasfl_ray.aggregation import aggregate_updates, validate_inputs
from hasfl_ray.aggregation.packed import to_device
from hasfl_ray.errors import ConfigError
from hasfl_ray.ops import aggregate as ops
from hasfl_ray.ops.sparse import build_sparse_layout
from test_sparse import assert_matches, edge_round, opposite_nans_round, oracle, random_round

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


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("kinds", [("index",), ("mask",), ("slice", "index", "mask")], ids=["index", "mask", "mixed"])
def test_the_tabled_kernel_equals_the_serial_one_bit_for_bit(monkeypatch, dtype, kinds):
    """sparse_kernels.cuh's two kernels do the same adds in the same order (test_sparse_cuda_emulated.py checks it
    on the CPU); here on the card, 300 holders included (entry tables in batches, norm slots in global memory)."""
    rounds = [random_round(3 + len(kinds), 11, dtype, kinds), random_round(4, 300, dtype, kinds)]
    for shapes, updates, weights, blocks in rounds:
        results = {}
        for kernel in ("serial", "tabled"):
            monkeypatch.setenv("HASFL_SPARSE_CUDA_KERNEL", kernel)
            results[kernel] = aggregate_updates(shapes, on_cuda(updates), weights, blocks, backend="fused")
        for name in shapes:
            assert torch.equal(results["serial"].delta[name], results["tabled"].delta[name]), name
        assert torch.equal(results["serial"].div_num, results["tabled"].div_num)
        assert torch.equal(results["serial"].div_den, results["tabled"].div_den)
    monkeypatch.setenv("HASFL_SPARSE_CUDA_KERNEL", "fast")
    with pytest.raises(ConfigError, match="HASFL_SPARSE_CUDA_KERNEL is 'fast' in the environment; expected tabled"):
        aggregate_updates(shapes, on_cuda(updates), weights, blocks, backend="fused")  # the Python entry's sentence
    on_card = on_cuda(updates)  # and the op's own check, for a caller past the Python entry
    layout = build_sparse_layout(shapes, on_card, blocks)
    out = torch.empty(layout.total_numel, dtype=dtype, device="cuda")
    weights_t = validate_inputs(shapes, on_card, weights, blocks)[1]
    with pytest.raises(RuntimeError, match="HASFL_SPARSE_CUDA_KERNEL is 'fast'; expected tabled or serial"):
        torch.ops.hasfl_ray.aggregate_sparse_into(out, layout.packed, layout.params, layout.entries, weights_t,
                                                  layout.kinds, layout.bits, layout.rows, layout.row_offsets)


def test_a_nan_mean_on_the_card_is_the_cpus_nan():
    """-NaN and NaN meeting on a coordinate give the CPU builds' canonical NaN, mean and norms, bit for bit."""
    (shapes, updates, weights, blocks), name = opposite_nans_round(torch.float32)
    cpu = aggregate_updates(shapes, updates, weights, blocks, backend="fused")
    card = aggregate_updates(shapes, on_cuda(updates), weights, blocks, backend="fused")
    nan = torch.isnan(cpu.delta[name])
    assert nan.any() and torch.equal(nan, torch.isnan(card.delta[name].cpu()))
    assert torch.equal(cpu.delta[name][nan].view(torch.int32), card.delta[name].cpu()[nan].view(torch.int32))
    for ours, theirs in ((cpu.div_num, card.div_num), (cpu.div_den, card.div_den)):
        both = torch.isnan(ours)
        assert both[:2].all() and torch.equal(both, torch.isnan(theirs.cpu()))
        assert torch.equal(ours[both].view(torch.int64), theirs.cpu()[both].view(torch.int64))
