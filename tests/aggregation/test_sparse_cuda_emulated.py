"""The sparse CUDA op's kernels (csrc/cuda/sparse_kernels.cuh) run on the CPU: the same kernel source and host
tables, each block's 128 threads as host threads meeting at every __syncthreads and warp shuffle
(cuda_emulation/emulate_cuda.h). What a card runs cannot be run here; this checks the kernels' logic where no card
is: the tabled kernel (the default) equals the serial one bit for bit (the same adds in the same order), both match
the float64 dense oracle, past 128 entries a parameter (entry tables in batches) and past 256 (norm slots in global
memory), and a NaN is written as the CPU builds write it. benchmarks/gpu_check.sh runs test_sparse_cuda.py on a card."""

import struct

import numpy as np
import pytest
import torch

from emulated_kernels import emulated as build_emulated
from emulated_kernels import needs_compiler
from hasfl_ray.aggregation import MaskedUpdate
from hasfl_ray.aggregation.result import AggregateResult
from hasfl_ray.ops import aggregate as ops
from hasfl_ray.ops.sparse import build_sparse_layout
from test_sparse import assert_matches, edge_round, opposite_nans_round, oracle, random_round

pytestmark = needs_compiler


@pytest.fixture(scope="module")
def emulated():
    return build_emulated()


def run(emulated, kernel, shapes, updates, weights, blocks):
    layout = build_sparse_layout(shapes, updates, blocks)
    out = torch.empty(layout.total_numel, dtype=layout.packed[0].dtype)
    weights = torch.as_tensor(weights, dtype=torch.float64)
    div_num, div_den, covered = emulated.aggregate_sparse_into(
        kernel, out, layout.packed, layout.params, layout.entries, weights, layout.kinds, layout.bits, layout.rows,
        layout.row_offsets)
    delta, start = {}, 0
    for name, shape in zip(layout.names, layout.shapes):
        size = int(np.prod(shape))
        delta[name] = out[start:start + size].view(shape)
        start += size
    return AggregateResult({name: delta[name] for name in shapes}, div_num, div_den,
                           int(covered) / layout.total_numel)


def check(emulated, shapes, updates, weights, blocks, dtype):
    serial = run(emulated, "serial", shapes, updates, weights, blocks)
    tabled = run(emulated, "tabled", shapes, updates, weights, blocks)
    for name in shapes:
        assert torch.equal(tabled.delta[name], serial.delta[name]), name
    assert torch.equal(tabled.div_num, serial.div_num) and torch.equal(tabled.div_den, serial.div_den)
    assert tabled.covered_fraction == serial.covered_fraction
    assert_matches(tabled, oracle(shapes, updates, weights, blocks), dtype)
    return tabled


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("kinds", [("index",), ("mask",), ("slice", "index", "mask")], ids=["index", "mask", "mixed"])
@pytest.mark.parametrize("num_clients", [1, 5, 11])
def test_tabled_equals_serial_and_the_oracle(emulated, dtype, kinds, num_clients):
    shapes, updates, weights, blocks = random_round(41 + 7 * num_clients + len(kinds), num_clients, dtype, kinds)
    check(emulated, shapes, updates, weights, blocks, dtype)


def test_edge_cases(emulated):
    shapes, updates, weights, blocks = edge_round(torch.float32)
    check(emulated, shapes, updates, weights, blocks, torch.float32)
    check(emulated, shapes, updates[:1], weights[:1], blocks, torch.float32)


def test_past_one_table_and_the_shared_slots(emulated):
    """300 holders of a parameter: three entry tables an item, and entries 256-299's norm slots in global memory."""
    rng = np.random.default_rng(5)
    shapes, blocks = {"m": (2, 150), "s": (40,)}, {}
    updates = []
    for client in range(300):
        m = torch.from_numpy(rng.standard_normal(shapes["m"])).float()
        mask = torch.from_numpy(rng.random(shapes["m"]) < rng.uniform(0.1, 0.9))
        update = {"m": MaskedUpdate.gather(m, mask)}
        if client % 3:
            update["s"] = torch.from_numpy(rng.standard_normal(int(rng.integers(1, 41)))).float()
        updates.append(update)
    weights = rng.uniform(0.5, 3.0, 300).tolist()
    check(emulated, shapes, updates, weights, blocks, torch.float32)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_a_nan_is_written_as_the_cpu_writes_it(emulated, dtype):
    """-NaN and NaN meeting on a coordinate: the mean there and the norms of its holders are the canonical NaN of
    the CPU builds (quiet, positive, no payload), in both kernels, equal to the CPU op's bits."""
    (shapes, updates, weights, blocks), name = opposite_nans_round(dtype)
    results = [run(emulated, kernel, shapes, updates, weights, blocks) for kernel in ("serial", "tabled")]
    if ops.available() and hasattr(torch.ops.hasfl_ray, "aggregate_sparse_into"):
        from hasfl_ray.aggregation import aggregate_updates

        results.append(aggregate_updates(shapes, updates, weights, blocks, backend="fused"))
    canonical = {torch.float32: struct.unpack("<i", struct.pack("<I", 0x7FC00000))[0],
                 torch.float64: struct.unpack("<q", struct.pack("<Q", 0x7FF8000000000000))[0]}[dtype]
    as_int = {torch.float32: torch.int32, torch.float64: torch.int64}[dtype]
    for result in results:
        bits = result.delta[name].reshape(-1).view(as_int)
        nan = torch.isnan(result.delta[name].reshape(-1))
        assert nan.any()
        assert (bits[nan] == canonical).all()
        for norms in (result.div_num, result.div_den):
            assert torch.isnan(norms[:2]).all()
            assert (norms[torch.isnan(norms)].view(torch.int64) == 0x7FF8000000000000).all()
