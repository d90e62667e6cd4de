"""Client-level DP of the aggregate (hasfl_ray/aggregation/privacy.py, docs/privacy.md): clipping over the held
coordinates, the holder counts every aggregation path implies, and the noised mean against a float64 oracle."""

from __future__ import annotations

import math

import pytest
import torch

from hasfl_ray.aggregation import MaskedUpdate, aggregate_updates
from hasfl_ray.aggregation.privacy import PrivacySettings, clip_updates, holder_counts, next_clip, privatize, update_norm
from hasfl_ray.aggregation.philox import philox_normals
from hasfl_ray.training.seeding import STREAM_PRIVACY, stream_seed

SHAPES = {"w": (6, 4), "b": (6,)}


def _updates(dtype=torch.float64):
    g = torch.Generator().manual_seed(3)
    out = []
    for rows in (6, 3, 3, 2):  # a full-width client and three narrower ones (leading slices)
        out.append({"w": torch.randn(rows, rows * 4 // 6 or 1, generator=g, dtype=dtype).contiguous() * 5,
                    "b": torch.randn(rows, generator=g, dtype=dtype)})
    return out


def _mean_of(backend):
    def mean_of(updates, extra):
        return aggregate_updates(SHAPES, updates, [1.0] * len(updates), backend=backend)
    return mean_of


def _oracle(updates, clip, z, seed, key):
    """Σ_i clip(u_i) / k + ξ / k per coordinate, in float64 from dense zero-padded tensors, written out directly."""
    total = {n: torch.zeros(s, dtype=torch.float64) for n, s in SHAPES.items()}
    count = {n: torch.zeros(s, dtype=torch.float64) for n, s in SHAPES.items()}
    for update in updates:
        norm = math.sqrt(sum(float((t.double() ** 2).sum()) for t in update.values()))
        factor = min(1.0, clip / norm)
        for name, t in update.items():
            index = tuple(slice(0, d) for d in t.shape)
            total[name][index] += t.double() * factor
            count[name][index] += 1
    draws = philox_normals(stream_seed(seed, STREAM_PRIVACY), key, sum(math.prod(s) for s in SHAPES.values()))
    out, start = {}, 0
    for name, shape in SHAPES.items():  # coordinate j's draw: its index in the flat model, parameters in order
        xi = draws[start:start + math.prod(shape)].view(shape) * z * clip
        start += math.prod(shape)
        k = count[name]
        out[name] = torch.where(k > 0, (total[name] + xi) / torch.where(k > 0, k, 1), 0)
    return out


def test_clipping_bounds_the_norm_over_held_coordinates():
    updates = _updates()
    norms = [update_norm(u) for u in updates]
    clip = sorted(norms)[1] * 1.01  # some clipped, some not
    clipped, before = clip_updates(updates, [0, 1, 2, 3], clip)
    assert before == norms
    for update, original, norm in zip(clipped, updates, norms):
        assert update_norm(update) <= clip * (1 + 1e-12)
        if norm <= clip:
            assert all(torch.equal(update[n], original[n]) for n in original)
        else:
            assert update_norm(update) == pytest.approx(clip, rel=1e-12)
    # a client twice among the updates (an asynchronous buffer): each copy gets half the bound
    twice, _ = clip_updates(updates[:2], [7, 7], 1e-3)
    assert sum(update_norm(u) for u in twice) == pytest.approx(1e-3, rel=1e-12)


@pytest.mark.parametrize("backend", ["reference", "fused"])
def test_noised_mean_matches_float64_oracle(backend):
    from hasfl_ray.aggregation import fused_available
    if backend == "fused" and not fused_available():
        pytest.skip("hasfl_ray._C is not built here, so the fused backend cannot run")
    updates = _updates()
    settings = PrivacySettings(noise_multiplier=0.7, clip=2.0, seed=11, updates=5)
    aggregate, keys = privatize(_mean_of(backend), SHAPES, updates, [0, 1, 2, 3], settings)
    expected = _oracle(updates, 2.0, 0.7, 11, 5)
    for name in SHAPES:
        torch.testing.assert_close(aggregate.delta[name], expected[name], rtol=1e-12, atol=1e-12)
    assert keys["dp_updates"] == 6 and settings.updates == 6 and keys["dp_clip"] == 2.0


def test_noise_std_is_z_clip_over_holders():
    """Zero updates: what is left is ξ/k, whose spread is z·C/k (2000 coordinates held by 1 and 4 clients)."""
    shapes = {"w": (2000, 2)}
    updates = [{"w": torch.zeros(2000, 2 if i == 0 else 1, dtype=torch.float64)} for i in range(4)]
    mean_of = lambda ups, extra: aggregate_updates(shapes, ups, [1.0] * len(ups), backend="reference")  # noqa: E731
    aggregate, _ = privatize(mean_of, shapes, updates, [0, 1, 2, 3], PrivacySettings(1.5, 0.5, seed=1))
    delta = aggregate.delta["w"]
    assert float(delta[:, 1].std()) == pytest.approx(1.5 * 0.5 / 1, rel=0.05)  # column 1: client 0 alone
    assert float(delta[:, 0].std()) == pytest.approx(1.5 * 0.5 / 4, rel=0.05)  # column 0: all four


def test_holder_counts_of_masks():
    g = torch.Generator().manual_seed(0)
    masks = [torch.rand(6, 4, generator=g) < 0.5 for _ in range(3)]
    updates = [{"w": MaskedUpdate.gather(torch.ones(6, 4), m)} for m in masks]
    shapes = {"w": (6, 4)}
    counts = holder_counts(lambda ups, extra: aggregate_updates(shapes, ups, [1.0] * len(ups)).delta, shapes, updates)
    assert torch.equal(counts["w"], sum(m.double() for m in masks))


def test_same_key_same_noise_and_adaptive_clip_moves():
    updates = _updates(torch.float32)
    runs = []
    for _ in range(2):
        settings = PrivacySettings(1.0, 1.0, seed=4, updates=2, quantile=0.5, count_noise=0.2)
        aggregate, keys = privatize(_mean_of("reference"), SHAPES, updates, [0, 1, 2, 3], settings)
        runs.append((aggregate.delta, keys, settings.clip))
    assert all(torch.equal(runs[0][0][n], runs[1][0][n]) for n in SHAPES) and runs[0][1] == runs[1][1]
    keys = runs[0][1]
    # every update's norm is above 1 here: b̄ is the count noise alone, and the clip grows toward the median
    assert keys["dp_clipped"] == 1.0
    assert runs[0][2] == next_clip(1.0, keys["dp_unclipped_noised"], 0.5)
    other = PrivacySettings(1.0, 1.0, seed=4, updates=3)
    moved, _ = privatize(_mean_of("reference"), SHAPES, updates, [0, 1, 2, 3], other)
    assert not torch.equal(moved.delta["w"], runs[0][0]["w"])
