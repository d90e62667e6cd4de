"""The dense CUDA op's kernels (csrc/cuda/dense_kernels.cuh, dense_reduce.cuh: the slice and window layouts' fused
aggregation on a card) run on the CPU through emulated_kernels.py, the op's Python side unchanged (calls.aggregate_into
swapped for the emulation): against the float64 oracle where the kernel's paths split (16-byte vector loads and
scalar tails, misaligned tensors, rolled windows, boxes that do not nest, norm slots in shared and in global
memory, several persistent blocks sharing the work counter), run to run identity, and a NaN written as the CPU
writes it. What a card runs cannot be run here; test_fused_cuda.py is the same check on one ("needs CUDA")."""

import pytest
import torch

from aggregation_cases import Federation, random_federation
from emulated_kernels import emulated, needs_compiler
from hasfl_ray.aggregation import aggregate_updates, validate_inputs
from hasfl_ray.ops import aggregate as ops
from hasfl_ray.ops import calls
from test_fused_cuda import SHAPES, TIERS, misaligned
from test_reference import assert_matches_oracle

pytestmark = needs_compiler


@pytest.fixture
def on_emulated_cuda(monkeypatch):
    """calls.aggregate_into runs the emulated CUDA kernels (3 persistent blocks) on the CPU tensors it is given."""
    module = emulated()
    monkeypatch.setattr(calls, "aggregate_into", lambda out, packed, params, entries, weights: module.aggregate_into(
        out, list(packed), params, entries, weights, 3))


def run(federation):
    shapes, weights, blocks = validate_inputs(federation.shapes, federation.updates, federation.weights,
                                              federation.gate_blocks)
    dtype = next(t for u in federation.updates for t in u.values()).dtype
    total = sum(torch.Size(shape).numel() for shape in shapes.values())
    out = torch.full((total,), float("nan"), dtype=dtype)  # every element must be written
    return ops.aggregate_fused(shapes, federation.updates, weights, blocks, offsets=federation.offsets, out=out,
                               use_cache=False)


def federation_of(num_clients, dtype, shift=False, seed=0, shapes=SHAPES, tiers=TIERS):
    generator = torch.Generator().manual_seed(seed)
    updates = []
    for client in range(num_clients):
        update = {}
        for name, packed in tiers[client % len(tiers)].items():
            values = torch.randn(packed, generator=generator, dtype=torch.float64).to(dtype)
            update[name] = misaligned(values) if shift and client % 2 else values
        updates.append(update)
    weights = [float(w) for w in torch.rand(num_clients, generator=generator, dtype=torch.float64) * 99 + 1]
    return Federation(dict(shapes), updates, weights, {})


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("shift", [False, True], ids=["aligned", "misaligned"])
@pytest.mark.parametrize("num_clients", [1, 6, 37])
def test_vector_and_tail_paths_match_oracle(on_emulated_cuda, dtype, shift, num_clients):
    federation = federation_of(num_clients, dtype, shift, seed=num_clients)
    assert_matches_oracle(run(federation), federation, dtype)


@pytest.mark.parametrize("nested,rolling", [(True, False), (False, False), (True, True), (False, True)],
                         ids=["nested", "boxes", "rolling", "rolling-boxes"])
def test_random_federations_match_oracle(on_emulated_cuda, nested, rolling):
    """Every kind of parameter (gate blocks, merged conv dims, a scalar, one nobody trains) at random widths."""
    federation = random_federation(seed=7, num_clients=9, nested=nested, rolling=rolling)
    assert_matches_oracle(run(federation), federation, torch.float32)


def test_rolled_windows_match_oracle(on_emulated_cuda):
    federation = federation_of(8, torch.float32, seed=3)
    federation.offsets = [{"wide": (client % 5, 7 * client % 300), "odd": (0, 130 - client), "bias": (client,)}
                          for client in range(8)]
    assert_matches_oracle(run(federation), federation, torch.float32)


def test_many_clients_use_global_norm_slots(on_emulated_cuda):
    """More entries per parameter than the shared-memory slots hold (1536): partials in global memory."""
    shapes = {"w": (3, 130), "b": (5,)}
    tiers = [{"w": (3, 130), "b": (5,)}, {"w": (2, 64), "b": (3,)}, {"w": (1, 33), "b": (1,)}]
    federation = federation_of(1600, torch.float32, seed=5, shapes=shapes, tiers=tiers)
    assert_matches_oracle(run(federation), federation, torch.float32)


def test_results_are_bit_identical_run_to_run(on_emulated_cuda):
    federation = federation_of(50, torch.float32, shift=True, seed=6)
    first, second = run(federation), run(federation)
    for name in SHAPES:
        assert torch.equal(first.delta[name], second.delta[name])
    assert torch.equal(first.div_num, second.div_num) and torch.equal(first.div_den, second.div_den)


@pytest.mark.parametrize("dtype, as_int, nan", [(torch.float32, torch.int32, 0x7FC00000),
                                                (torch.float64, torch.int64, 0x7FF8000000000000)])
def test_a_nan_mean_is_the_cpus_nan(on_emulated_cuda, dtype, as_int, nan):
    """Slices holding -NaN and NaN on one coordinate: the mean there and both norms are the CPU builds' canonical
    NaN (CUDA's own has every mantissa bit set)."""
    g = torch.Generator().manual_seed(2)
    updates = [{"w": torch.randn(4, 300, generator=g, dtype=dtype)}, {"w": torch.randn(3, 200, generator=g,
                                                                                           dtype=dtype)}]
    updates[0]["w"][1, 7], updates[1]["w"][1, 7] = -float("nan"), float("nan")
    result = aggregate_updates({"w": (4, 300)}, updates, [1.0, 2.0], {}, backend="fused")
    mean = result.delta["w"]
    assert int(torch.isnan(mean).sum()) == 1
    assert mean[torch.isnan(mean)].view(as_int).item() == nan
    assert result.div_num.view(torch.int64).tolist() == [0x7FF8000000000000] * 2
    assert result.div_den.view(torch.int64).tolist() == [0x7FF8000000000000] * 2
