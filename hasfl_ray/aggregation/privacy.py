"""Client-level differential privacy of the aggregate, per width (docs/privacy.md).

Each accepted update is clipped to L2 norm C over the coordinates its client holds (its packed values), the
clipped updates are averaged with count weights (1 a client) by the round's own aggregation path (leading slices,
windows, index sets, masks, label split alike), and Gaussian noise is added to the *sum* before it is divided by
the number k_j of clients covering each coordinate j:

    Δ̃_j = (Σ_{i ∈ H_j} c_ij + ξ_j) / k_j,   ξ_j ~ N(0, z² C²),   so Δ̃_j = Δ̄_j + ξ_j / k_j  (std z·C / k_j),

and 0 (no noise) where no client covers j. Under Poisson participation (``expected`` set: q·N, the expected number
of participants) the denominator is that public number instead, Δ̃_j = (Σ_{i ∈ H_j} c_ij + ξ_j) / (q N) at every
coordinate (noise everywhere, a round without participants included): the actual holder counts would tell whether a
client took part, which the add-or-remove accounting of a Poisson sample must not reveal. ξ_j is a counter-based draw
in float64, Philox keyed by (run seed, STREAM_PRIVACY) with counter (update number, j), j the coordinate's index in
the flat model: the fused kernel's own draws (csrc/private_normal.h, one definition for its CPU and CUDA forms), so
that its one-pass form, the torch path, the local and Ray backends, any device and a resumed run add the same numbers.
Adaptive clipping (Andrew et al. 2021): b̄ = (Σ_i 1[‖u_i‖ ≤ C] + N(0, σ_b²)) / n and C ← C · exp(−η_C (b̄ − γ)).

Nothing here runs when DP is off: the server then never imports this module.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import torch

from hasfl_ray.aggregation.packed import SPARSE_TYPES, with_values
from hasfl_ray.training.seeding import STREAM_PRIVACY, stream_seed, torch_generator

#: Andrew et al.'s clip learning rate η_C (their geometric update's default, 0.2).
CLIP_LR = 0.2


@dataclass
class PrivacySettings:
    """What the server needs to privatise its next update, and its state (the update count and the clip).

    Attributes:
        noise_multiplier: z; the noise on the sum has std z·C.
        clip: C of the next update (the adaptive rule moves it after each update).
        seed: the run seed (the noise stream's key).
        updates: DP updates applied so far; the next one's noise is keyed by this number.
        quantile: γ of adaptive clipping, None for a fixed clip.
        count_noise: σ_b, the std of the noise on the count of unclipped updates (adaptive clipping).
        clip_lr: η_C.
        expected: Poisson participation: q·N, the public denominator of every coordinate's sum (and of the
            adaptive rule's count); None: fixed-size sampling, each coordinate's sum divided by its holders k_j.
    """

    noise_multiplier: float
    clip: float
    seed: int
    updates: int = 0
    quantile: Optional[float] = None
    count_noise: float = 0.0
    clip_lr: float = CLIP_LR
    expected: Optional[float] = None


def values_of(packed) -> torch.Tensor:
    return packed.values if isinstance(packed, SPARSE_TYPES) else packed


def update_norm(update: Mapping[str, object]) -> float:
    """‖u_i‖₂ over the coordinates the client holds (every packed value), in float64."""
    return math.sqrt(sum(float(values_of(t).to(torch.float64).square().sum()) for t in update.values()))


def clip_updates(updates: Sequence[Mapping[str, object]], clients: Sequence[int], clip: float
                 ) -> Tuple[List[Dict[str, object]], List[float]]:
    """Each update scaled by min(1, (C / r_i) / ‖u_i‖), r_i how often its client appears among ``updates`` (once in
    a round; an asynchronous buffer may hold two of one client): a client's updates together weigh at most C.
    Returns the clipped updates (the clients' dtype) and the norms before clipping."""
    repeats = Counter(clients)
    clipped, norms = [], []
    for update, client in zip(updates, clients):
        norm = update_norm(update)
        bound = clip / repeats[client]
        norms.append(norm)
        if norm <= bound:
            clipped.append(dict(update))
            continue
        factor = bound / norm
        out = {}
        for name, packed in update.items():
            values = values_of(packed)
            scaled = (values.to(torch.float64) * factor).to(values.dtype).contiguous()
            out[name] = with_values(packed, scaled) if isinstance(packed, SPARSE_TYPES) else scaled
        clipped.append(out)
    return clipped, norms


def indicators(updates: Sequence[Mapping[str, object]]) -> List[Dict[str, object]]:
    """Each update with every held value 1 (its coverage, in its own packing)."""
    out = []
    for update in updates:
        ones = {}
        for name, packed in update.items():
            values = torch.ones_like(values_of(packed), dtype=torch.float64)
            ones[name] = with_values(packed, values) if isinstance(packed, SPARSE_TYPES) else values
        out.append(ones)
    return out


def holder_counts(mean_of: Callable[[List[Dict[str, object]], bool], Mapping[str, torch.Tensor]],
                  shapes: Mapping[str, Sequence[int]], updates: Sequence[Mapping[str, object]]
                  ) -> Dict[str, torch.Tensor]:
    """k_j, the clients the aggregation path averages coordinate j over, float64 CPU (0 where none does).

    ``mean_of(updates, extra)`` is the path's count-weighted mean (``extra``: the last update is one more client
    holding everything, beside the others). With every client's values 1 and the extra client's 0 the path returns
    k_j / (k_j + 1) at every coordinate, whatever decides who covers it (slices, windows, masks, label holders), so
    k_j = r / (1 − r), rounded (exact integers)."""
    device = next(values_of(t) for u in updates for t in u.values()).device
    extra = {name: torch.zeros(tuple(shape), dtype=torch.float64, device=device) for name, shape in shapes.items()}
    ratio = mean_of(indicators(updates) + [extra], True)
    counts = {}
    for name in shapes:
        r = ratio[name].to("cpu", torch.float64)
        counts[name] = torch.round(r / (1 - r))
    return counts


def noise_key(settings: PrivacySettings) -> int:
    """The Philox key of the run's noise (63 bits of the stream (seed, STREAM_PRIVACY)); the counter is (update
    number, coordinate)."""
    return stream_seed(settings.seed, STREAM_PRIVACY)


def normal_draws(key: int, offset: int, n: int) -> torch.Tensor:
    """normal(key, offset, j) for j < n, float64 CPU: the fused kernel's draws (csrc/cpu/aggregate_private.cpp),
    computed by its op where the extension has it, else by :func:`hasfl_ray.aggregation.philox.philox_normals`
    (the same operations in numpy: the same bits)."""
    from hasfl_ray.ops import aggregate_private

    if aggregate_private.available():
        return aggregate_private.normals(key, offset, n)
    from hasfl_ray.aggregation.philox import philox_normals

    return philox_normals(key, offset, n)


def noised(delta: Mapping[str, torch.Tensor], counts: Mapping[str, torch.Tensor], settings: PrivacySettings
           ) -> Dict[str, torch.Tensor]:
    """Δ̄ + ξ / k per coordinate (module docstring), ξ_j ~ N(0, (z C)²) the draw of coordinate j (its index in the
    flat model, parameters in ``counts``' order: the model's) of the update's counter; under Poisson participation
    (Δ̄ k + ξ) / (q N) at every coordinate."""
    std = settings.noise_multiplier * settings.clip
    total = sum(k.numel() for k in counts.values())
    draws = normal_draws(noise_key(settings), settings.updates, total)
    out, start = {}, 0
    for name, k in counts.items():
        xi = draws[start:start + k.numel()].view(k.shape) * std
        start += k.numel()
        mean = delta[name]
        if settings.expected is not None:  # the clipped sum S = Δ̄ k (recovered in float64), over the public q N
            total_sum = mean.to("cpu", torch.float64) * k + xi
            out[name] = (total_sum / settings.expected).to(mean.device, mean.dtype)
            continue
        noise = torch.where(k > 0, xi / torch.where(k > 0, k, 1), 0)
        out[name] = (mean.to(torch.float64) + noise.to(mean.device)).to(mean.dtype)
    return {name: out[name] for name in delta}


def privatize(mean_of: Callable[[List[Dict[str, object]], bool], object], shapes: Mapping[str, Sequence[int]],
              updates: Sequence[Mapping[str, object]], clients: Sequence[int], settings: PrivacySettings,
              fused: Optional[Callable[..., object]] = None) -> Tuple[object, Dict[str, float]]:
    """One DP update: clip, count-weighted mean (``mean_of(updates, False)``, the path's AggregateResult; with no
    update, which only Poisson participation applies, an aggregate of zeros), noise;
    the settings move on (update count, adaptive clip). Returns the aggregate (its ``delta`` noised; the divergence
    norms are the clipped updates' against the noiseless mean) and the metrics line's keys.

    ``fused(updates, bounds, std, key, offset, expected)``, where the round's layout has it (slices and windows,
    :func:`hasfl_ray.ops.aggregate_private.aggregate_private`; index sets, masks and the label split,
    :func:`hasfl_ray.ops.aggregate_private.aggregate_private_sparse`; on the CPU, and on CUDA where built:
    :func:`hasfl_ray.engine.server_privacy.fused_form`), does clip, mean, counts and noise in the kernel's one pass
    with the same draws; the torch path otherwise (``--aggregation reference``, a layout the op cannot express)."""
    clip = settings.clip
    if fused is not None and updates:
        repeats = Counter(clients)
        got = fused(updates, [clip / repeats[c] for c in clients], settings.noise_multiplier * clip,
                    noise_key(settings), settings.updates, settings.expected)
        aggregate, norms = got.result, got.norms.tolist()
    else:
        clipped, norms = clip_updates(updates, clients, clip)
        aggregate = mean_of(clipped, False)  # no update (Poisson participation, nobody came): zeros, the noise alone
        counts = holder_counts(lambda ups, extra: mean_of(ups, extra).delta, shapes, clipped) if clipped else \
            {name: torch.zeros(tuple(shape), dtype=torch.float64) for name, shape in shapes.items()}
        aggregate.delta = noised(aggregate.delta, counts, settings)
    keys: Dict[str, float] = {"dp_clip": clip, "dp_clipped": sum(n > clip for n in norms) / max(len(norms), 1)}
    if settings.quantile is not None:
        unclipped = sum(n <= clip for n in norms)
        generator = torch_generator(settings.seed, STREAM_PRIVACY, settings.updates)
        count_noise = float(torch.randn((), generator=generator, dtype=torch.float64)) * settings.count_noise
        denominator = settings.expected if settings.expected is not None else len(norms)
        keys["dp_unclipped_noised"] = (unclipped + count_noise) / denominator
        settings.clip = next_clip(clip, keys["dp_unclipped_noised"], settings.quantile, settings.clip_lr)
    settings.updates += 1
    keys["dp_updates"] = settings.updates
    return aggregate, keys


def next_clip(clip: float, unclipped: float, quantile: float, clip_lr: float = CLIP_LR) -> float:
    """Andrew et al.'s geometric rule C · exp(−η_C (b̄ − γ)) (a resumed run recomputes it from its last line)."""
    return clip * math.exp(-clip_lr * (unclipped - quantile))


__all__ = ["CLIP_LR", "PrivacySettings", "clip_updates", "holder_counts", "next_clip", "noise_key", "noised",
           "normal_draws", "privatize",
           "update_norm"]
