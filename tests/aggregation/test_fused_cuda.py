"""The CUDA kernel against the float64 oracle where its paths split: 16-byte vector loads, scalar tails,
misaligned tensors, rolled windows, rows over several 128-column tiles, norm slots in global memory."""

import math

import pytest
import torch

from aggregation_cases import Federation
from hasfl_ray.aggregation import validate_inputs
from hasfl_ray.ops import aggregate as ops
from test_reference import assert_matches_oracle

pytestmark = pytest.mark.skipif(not (torch.cuda.is_available() and ops.available() and ops.cuda_available()),
                                reason="needs CUDA")

# name -> full shape. Last dims: 300 (3 tiles, the last of 44 columns), 131 (odd), 128 (exactly one tile),
# 4 and 1 (narrower than a vector); a 1-D parameter; a conv whose 3 x 3 trailing dims are merged.
SHAPES = {"wide": (5, 300), "odd": (7, 131), "tile": (3, 128), "narrow": (9, 4), "column": (6, 1),
          "bias": (37,), "conv": (6, 5, 3, 3)}
# Packed sizes per width tier: widths that are multiples of 4 (vector path) and not (scalar tails).
TIERS = [
    {"wide": (5, 300), "odd": (7, 131), "tile": (3, 128), "narrow": (9, 4), "column": (6, 1), "bias": (37,),
     "conv": (6, 5, 3, 3)},
    {"wide": (4, 258), "odd": (5, 100), "tile": (2, 128), "narrow": (6, 3), "column": (4, 1), "bias": (29,),
     "conv": (4, 4, 3, 3)},
    {"wide": (3, 129), "odd": (3, 65), "tile": (2, 64), "narrow": (3, 2), "column": (2, 1), "bias": (13,),
     "conv": (3, 2, 3, 3)},
    {"wide": (1, 4), "odd": (1, 1), "tile": (1, 5), "narrow": (1, 1), "column": (1, 1), "bias": (1,),
     "conv": (1, 1, 3, 3)},
]


def misaligned(tensor: torch.Tensor) -> torch.Tensor:
    """The same values, contiguous, starting one element past a 16-byte boundary (no vector loads)."""
    buffer = torch.empty(tensor.numel() + 1, dtype=tensor.dtype, device=tensor.device)
    view = buffer[1:].view(tensor.shape)
    view.copy_(tensor)
    assert view.data_ptr() % 16 != 0
    return view


def federation_of(num_clients, dtype, shift=False, seed=0, shapes=SHAPES, tiers=TIERS):
    generator = torch.Generator().manual_seed(seed)
    updates = []
    for client in range(num_clients):
        tier = tiers[client % len(tiers)]
        update = {}
        for name, packed in tier.items():
            values = torch.randn(packed, generator=generator, dtype=torch.float64).to(dtype).cuda()
            update[name] = misaligned(values) if shift and client % 2 else values
        updates.append(update)
    weights = [float(w) for w in torch.rand(num_clients, generator=generator, dtype=torch.float64) * 99 + 1]
    return Federation(dict(shapes), updates, weights, {})


def run(federation, offsets=None):
    shapes, weights, blocks = validate_inputs(federation.shapes, federation.updates, federation.weights,
                                              federation.gate_blocks)
    total = sum(math.prod(shape) for shape in shapes.values())
    dtype = next(iter(federation.updates[0].values())).dtype
    out = torch.full((total,), float("nan"), dtype=dtype, device="cuda")  # every element must be written
    return ops.aggregate_fused(shapes, federation.updates, weights, blocks, offsets=offsets, out=out,
                               use_cache=False)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("shift", [False, True], ids=["aligned", "misaligned"])
@pytest.mark.parametrize("num_clients", [1, 6, 37])
def test_vector_and_tail_paths_match_oracle(dtype, shift, num_clients):
    federation = federation_of(num_clients, dtype, shift, seed=num_clients)
    assert_matches_oracle(run(federation), federation, dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_rolled_windows_match_oracle(dtype):
    federation = federation_of(8, dtype, seed=3)
    offsets = [{"wide": (client % 5, 7 * client % 300), "odd": (0, 130 - client), "bias": (client,)}
               for client in range(8)]
    federation.offsets = offsets
    assert_matches_oracle(run(federation, offsets), federation, dtype)


def test_boxes_that_do_not_nest_match_oracle():
    # tiers 1 and 2 swapped for one parameter: wider in one dim, narrower in the other
    tiers = [dict(TIERS[0]), dict(TIERS[2], wide=(5, 64)), dict(TIERS[1], wide=(2, 296))]
    federation = federation_of(9, torch.float32, seed=4, tiers=tiers)
    assert_matches_oracle(run(federation), federation, torch.float32)


def test_many_clients_use_global_norm_slots():
    """More entries per parameter than the shared-memory slots hold (1536): partials in global memory."""
    shapes = {"w": (3, 130), "b": (5,)}
    tiers = [{"w": (3, 130), "b": (5,)}, {"w": (2, 64), "b": (3,)}, {"w": (1, 33), "b": (1,)}]
    federation = federation_of(1600, torch.float32, seed=5, shapes=shapes, tiers=tiers)
    assert_matches_oracle(run(federation), federation, torch.float32)


def test_cuda_results_are_bit_identical_run_to_run():
    federation = federation_of(50, torch.float32, shift=True, seed=6)
    first, second = run(federation), run(federation)
    for name in SHAPES:
        assert torch.equal(first.delta[name], second.delta[name])
    assert torch.equal(first.div_num, second.div_num) and torch.equal(first.div_den, second.div_den)


def test_a_nan_mean_on_the_card_is_the_cpus_nan():
    """Slices holding -NaN and NaN on one coordinate: the mean there and both clients' norms are the CPU builds'
    canonical NaN (quiet, positive, no payload), bit for bit, in float32 and float64."""
    from hasfl_ray.aggregation import aggregate_updates

    for dtype, as_int in ((torch.float32, torch.int32), (torch.float64, torch.int64)):
        g = torch.Generator().manual_seed(2)
        shapes = {"w": (4, 300)}
        updates = [{"w": torch.randn(4, 300, generator=g, dtype=dtype)}, {"w": torch.randn(3, 200, generator=g,
                                                                                               dtype=dtype)}]
        updates[0]["w"][1, 7], updates[1]["w"][1, 7] = -float("nan"), float("nan")
        cpu = aggregate_updates(shapes, updates, [1.0, 2.0], {}, backend="fused")
        card = aggregate_updates(shapes, [{"w": u["w"].cuda()} for u in updates], [1.0, 2.0], {}, backend="fused")
        nan = torch.isnan(cpu.delta["w"])
        assert nan.sum() == 1 and torch.equal(nan, torch.isnan(card.delta["w"].cpu()))
        assert torch.equal(cpu.delta["w"][nan].view(as_int), card.delta["w"].cpu()[nan].view(as_int))
        for ours, theirs in ((cpu.div_num, card.div_num), (cpu.div_den, card.div_den)):
            assert torch.isnan(ours).all() and torch.equal(ours.view(torch.int64), theirs.cpu().view(torch.int64))
