"""Test helpers of the aggregation tests: a float64 oracle with explicit masks, random federations, and the
agreement of the implementations `hasfl-ray bench aggregate` times with the reference."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch

from hasfl_ray.bench.aggregate import implementations, make_federation


def global_indices(full: Sequence[int], packed: Sequence[int], blocks: int = 1,
                   offset: Optional[Sequence[int]] = None) -> Tuple[torch.Tensor, ...]:
    """Per dim, the global index of every packed index (open mesh, ready for advanced indexing).

    Packed index j of dim d holds global index (j + offset[d]) mod full[d]; with ``blocks`` > 1, dim 0
    is that many equal blocks and the rule applies inside each block (j = block * h + r, h = packed[0] //
    blocks). Offset 0 everywhere is the leading slice.
    """
    offset = list(offset) if offset is not None else [0] * len(full)
    per_dim = []
    for d, (size, count, start) in enumerate(zip(full, packed, offset)):
        j = torch.arange(count)
        if d == 0 and blocks > 1:
            rows, h = size // blocks, count // blocks
            per_dim.append((j // h) * rows + (j % h + start) % rows)
        else:
            per_dim.append((j + start) % size)
    return tuple(torch.meshgrid(*per_dim, indexing="ij")) if per_dim else ()


def oracle(shapes: Dict[str, Tuple[int, ...]], updates: Sequence[Dict[str, torch.Tensor]], weights: Sequence[float],
           gate_blocks: Optional[Dict[str, int]] = None,
           offsets: Optional[Sequence[Dict[str, Sequence[int]]]] = None):
    """The definition, in float64, with one explicit full-shape mask and zero-padded update per client.

    Returns (delta float64 per name, div_num, div_den, covered_fraction).
    """
    gate_blocks = gate_blocks or {}
    num_clients = len(updates)
    div_num = torch.zeros(num_clients, dtype=torch.float64)
    div_den = torch.zeros(num_clients, dtype=torch.float64)
    delta, covered, total = {}, 0, 0
    for name, shape in shapes.items():
        masks, padded = {}, {}
        for i, update in enumerate(updates):
            if name not in update:
                continue
            packed = update[name].detach().cpu().to(torch.float64)
            start = (offsets[i].get(name) if offsets is not None else None)
            index = global_indices(shape, packed.shape, gate_blocks.get(name, 1), start)
            masks[i] = torch.zeros(shape, dtype=torch.float64)
            masks[i][index] = 1.0
            padded[i] = torch.zeros(shape, dtype=torch.float64)
            padded[i][index] = packed
        numerator = torch.zeros(shape, dtype=torch.float64)
        denominator = torch.zeros(shape, dtype=torch.float64)
        for i in masks:
            numerator += float(weights[i]) * padded[i]
            denominator += float(weights[i]) * masks[i]
        mean = torch.where(denominator > 0, numerator / denominator.clamp_min(1e-300), torch.zeros(()))
        for i in masks:
            div_num[i] += ((padded[i] - mean) * masks[i]).square().sum()
            div_den[i] += (mean * masks[i]).square().sum()
        delta[name] = mean
        covered += int((denominator > 0).sum())
        total += math.prod(shape)
    return delta, div_num, div_den, covered / total if total else 0.0


@dataclass
class Federation:
    """One random aggregation problem."""

    shapes: Dict[str, Tuple[int, ...]]
    updates: List[Dict[str, torch.Tensor]]
    weights: List[float]
    gate_blocks: Dict[str, int] = field(default_factory=dict)
    offsets: Optional[List[Dict[str, Tuple[int, ...]]]] = None


def _sliced(size: int, p: float, scaled: bool = True, unit: int = 1) -> int:
    return max(1, math.ceil(p * size / unit)) * unit if scaled else size


def random_federation(seed: int, num_clients: int, dtype: torch.dtype = torch.float32, nested: bool = True,
                      rolling: bool = False, lack_probability: float = 0.2, device: str = "cpu") -> Federation:
    """A small model with every kind of parameter, and clients at random widths.

    Kinds: conv (out, in, 3, 3) with the input channel count unsliced or sliced, linear, bias, BatchNorm
    weight, LSTM gate matrices (4 gate blocks), a flattened-conv linear (unit 4), a 0-d scalar, a
    parameter nobody trains. ``nested=False`` draws every dim's packed size independently (boxes that do
    not contain one another); ``rolling=True`` adds per-client rolling offsets (shared per parameter when
    ``nested``, independent otherwise). Each client lacks each parameter with ``lack_probability``.
    """
    rng = np.random.default_rng(seed)
    generator = torch.Generator().manual_seed(seed)
    hidden = int(rng.integers(3, 9))
    conv_out, conv_in = int(rng.integers(2, 10)), int(rng.integers(1, 4))
    # name: (shape, per-dim (scaled, unit), gate blocks)
    kinds = {
        "conv1.weight": ((conv_out, conv_in, 3, 3), ((True, 1), (False, 1), (False, 1), (False, 1)), 1),
        "conv2.weight": ((conv_out + 1, conv_out, 3, 3), ((True, 1), (True, 1), (False, 1), (False, 1)), 1),
        "conv2.bias": ((conv_out + 1,), ((True, 1),), 1),
        "bn.weight": ((conv_out + 1,), ((True, 1),), 1),
        "fc1.weight": ((hidden, (conv_out + 1) * 4), ((True, 1), (True, 4)), 1),
        "lstm.weight_ih": ((4 * hidden, hidden), ((True, 1), (True, 1)), 4),
        "lstm.weight_hh": ((4 * hidden, hidden), ((True, 1), (True, 1)), 4),
        "lstm.bias": ((4 * hidden,), ((True, 1),), 4),
        "fc2.weight": ((int(rng.integers(2, 6)), hidden), ((False, 1), (True, 1)), 1),
        "scale": ((), (), 1),
        "untrained.weight": ((3, 2), ((True, 1), (True, 1)), 1),
    }
    shapes = {name: shape for name, (shape, _, _) in kinds.items()}
    blocks = {name: g for name, (_, _, g) in kinds.items() if g > 1}
    widths = rng.choice([0.25, 0.5, 0.75, 1.0], size=num_clients) if nested else rng.uniform(0.05, 1.0, num_clients)
    shared_offsets = {name: tuple(int(rng.integers(0, max(1, (s // g if d == 0 else s))))
                                  for d, s in enumerate(shape)) for name, (shape, _, g) in kinds.items()}
    updates, offsets = [], []
    for client in range(num_clients):
        update, client_offsets = {}, {}
        for name, (shape, dims, g) in kinds.items():
            if name == "untrained.weight" or (client > 0 and rng.random() < lack_probability):
                continue
            if nested:
                packed = [_sliced(s // (g if d == 0 else 1), widths[client], scaled, unit) * (g if d == 0 else 1)
                          for d, (s, (scaled, unit)) in enumerate(zip(shape, dims))]
            else:
                packed = [int(rng.integers(0, s // (g if d == 0 else 1) + 1)) * (g if d == 0 else 1) if scaled else s
                          for d, (s, (scaled, unit)) in enumerate(zip(shape, dims))]
            update[name] = torch.randn(packed, generator=generator, dtype=torch.float64).to(dtype).to(device)
            if rolling:
                client_offsets[name] = shared_offsets[name] if nested else tuple(
                    int(rng.integers(0, max(1, (s // g if d == 0 else s)))) for d, s in enumerate(shape))
        updates.append(update)
        offsets.append(client_offsets)
    weights = [float(w) for w in rng.uniform(0.1, 100.0, num_clients)]
    return Federation(shapes, updates, weights, blocks, offsets if rolling else None)


def check_agreement(model: str = "digits", num_clients: int = 6, device: str = "cpu") -> float:
    """Largest relative difference of Δ̄ and the norms between every implementation and the reference."""
    federation = make_federation(model, num_clients, device=device, dtype=torch.float64)
    runs = implementations(federation)
    runs.pop("fused kernel", None)
    reference = runs.pop("reference")()
    worst = 0.0
    for run in runs.values():
        result = run()
        for name, expected in reference.delta.items():
            scale = float(expected.abs().max()) or 1.0
            worst = max(worst, float((result.delta[name] - expected).abs().max()) / scale)
        for got, expected in ((result.div_num, reference.div_num), (result.div_den, reference.div_den)):
            worst = max(worst, float(((got.cpu() - expected).abs() / expected.abs().clamp_min(1e-30)).max()))
    return worst


def stdout_in_each_build(script: str) -> set:
    """The distinct stdouts of ``python -c script`` in this CPU's build and in the portable one
    (HASFL_PORTABLE_CPU_KERNEL=1): one element where every build prints the same."""
    seen = set()
    for portable in (False, True):
        env = {k: v for k, v in os.environ.items() if k != "HASFL_PORTABLE_CPU_KERNEL"}
        if portable:
            env["HASFL_PORTABLE_CPU_KERNEL"] = "1"
        done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        seen.add(done.stdout.strip())
    return seen
