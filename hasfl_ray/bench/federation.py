"""One round's packed updates of a benchmark case at the paper's tier mix, and the memory a case needs (shared by
the slice harness, :mod:`hasfl_ray.bench.aggregate`, and the other layouts', :mod:`hasfl_ray.bench.layouts`)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch

from hasfl_ray.bench.torch_aggregations import Shapes, Updates
from hasfl_ray.data.memory import check_client_memory
from hasfl_ray.data.partition import TIER_PROBABILITIES, TIERS
from hasfl_ray.models import build_model, gate_blocks_of


@dataclass(frozen=True)
class Federation:
    """One round's packed updates at the paper's tier mix."""

    model: str
    shapes: Shapes
    updates: Updates
    weights: torch.Tensor  # float64 CPU (num_clients,)
    gate_blocks: Dict[str, int]
    widths: Tuple[float, ...]
    #: Per client, name -> window start per dim (the window layout); None: leading slices.
    offsets: Optional[List[Dict[str, Tuple[int, ...]]]] = None

    @property
    def packed_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for u in self.updates for t in u.values())

    @property
    def output_bytes(self) -> int:
        first = next(iter(self.updates[0].values()))
        element = (first if isinstance(first, torch.Tensor) else first.values).element_size()
        return sum(math.prod(shape) for shape in self.shapes.values()) * element


def make_federation(model: str, num_clients: int, device: str = "cpu", seed: int = 0,
                    dtype: torch.dtype = torch.float32) -> Federation:
    """Random packed updates of ``num_clients`` clients of ``model`` with widths drawn at the paper's tier mix
    (:data:`hasfl_ray.data.partition.TIERS` with :data:`~hasfl_ray.data.partition.TIER_PROBABILITIES`)."""
    specs = build_model(model).param_specs()
    rng = np.random.default_rng(seed)
    widths = tuple(float(p) for p in rng.choice(TIERS, size=num_clients, p=TIER_PROBABILITIES))
    generator = torch.Generator().manual_seed(seed)
    updates = [{name: torch.randn(spec.sliced_shape(p), generator=generator, dtype=dtype).to(device)
                for name, spec in specs.items()} for p in widths]
    weights = torch.as_tensor(rng.integers(20, 500, num_clients), dtype=torch.float64)
    return Federation(model, {name: spec.shape for name, spec in specs.items()}, updates, weights,
                      gate_blocks_of(specs), widths)


#: A case's peak memory per client, in multiples of the client's packed update (float32) at the tier mix: the
#: updates themselves plus what the implementations build beside them (one parameter's stacked copy, the fused
#: layout, the reference's float64 work). Measured 2.4x (Shakespeare LSTM) to 3.3x (EMNIST CNN) at 200 clients;
#: rounded up.
PEAK_PER_PACKED_BYTE = 4


def bytes_per_client(model: str) -> int:
    """The memory a case of ``model`` needs per client (the estimate ``bench aggregate --clients`` is held to)."""
    specs = build_model(model).param_specs().values()
    packed = sum(share * sum(math.prod(spec.sliced_shape(tier)) for spec in specs)
                 for tier, share in zip(TIERS, TIER_PROBABILITIES))
    return math.ceil(PEAK_PER_PACKED_BYTE * 4 * packed)


def check_case_memory(models: Sequence[str], client_counts: Sequence[int], device: str = "cpu") -> None:
    """Refuse, in one sentence giving the estimate (simulate's rule, :func:`check_client_memory`), a case whose
    updates cannot fit in this machine's memory, or the GPU's with ``device`` cuda, before any is made (cases run
    one after another: the largest one counts)."""
    total = torch.cuda.get_device_properties(0).total_memory if device.startswith("cuda") else None
    check_client_memory(max(client_counts), max(bytes_per_client(model) for model in models), total,
                        "the GPU" if total is not None else "this machine")
