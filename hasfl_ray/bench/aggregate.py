"""Throughput of the fused aggregation against pure-torch ways of computing the same result.

Used by ``hasfl-ray bench aggregate`` and ``benchmarks/bench_aggregate.py``; the pure-torch competitors live in
:mod:`hasfl_ray.bench.torch_aggregations` (and stay importable from here). Every implementation timed here
computes the full result (Δ̄, both per-client norms, covered fraction) from the same packed updates, so
the timings compare like with like (``check_agreement`` in tests/aggregation/aggregation_cases.py holds them to
the reference). Effective bandwidth counts the bytes that must move: every packed
client byte read once plus the global output written once.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch

from hasfl_ray.aggregation import aggregate_updates, validate_inputs
from hasfl_ray.aggregation.reference import aggregate_reference
from hasfl_ray.bench.federation import (PEAK_PER_PACKED_BYTE, Federation, bytes_per_client,  # noqa: F401
                                        check_case_memory, make_federation)
from hasfl_ray.bench.torch_aggregations import (Shapes, Updates, aggregate_dense, aggregate_heterofl_loop,
                                                aggregate_torch_per_client, aggregate_torch_sliced,
                                                aggregate_torch_stacked)
from hasfl_ray.ops import aggregate as ops
from hasfl_ray.ops import calls

#: Benchmarked models: the dataset names of :func:`hasfl_ray.models.build_model`.
MODELS = ("emnist", "cifar10", "shakespeare")

#: The pure-torch implementations that compete for "best torch" in the headline ratios.
TORCH_IMPLEMENTATIONS = ("torch sliced", "torch stacked", "torch per client", "torch index_add", "torch dense",
                         "torch window scatter")

Aggregator = Callable[[Shapes, Updates, torch.Tensor, Dict[str, int]], object]


@dataclass(frozen=True)
class Timing:
    """Median time of one implementation on one federation."""

    model: str
    clients: int
    implementation: str
    median_s: float
    repeats: int
    gbps: float  # effective: (packed client bytes + output bytes) / median_s


@dataclass(frozen=True)
class CaseResult:
    """All timings of one (model, clients) case, the copy bandwidth measured beside them, and ratios."""

    model: str
    clients: int
    device: str
    packed_mb: float
    output_mb: float
    copy_gbps: float  # a large torch copy: (read + written bytes) / time
    sum_gbps: float  # a large torch sum: read bytes / time
    timings: List[Timing]
    layout: str = "slice"

    def time_of(self, implementation: str) -> Optional[float]:
        return next((t.median_s for t in self.timings if t.implementation == implementation), None)

    def gbps_of(self, implementation: str) -> Optional[float]:
        return next((t.gbps for t in self.timings if t.implementation == implementation), None)

    def best_torch(self) -> Optional[str]:
        """The fastest of the pure-torch implementations (not the reference, dense or HeteroFL ones)."""
        times = [(t.median_s, t.implementation) for t in self.timings if t.implementation in TORCH_IMPLEMENTATIONS]
        return min(times)[1] if times else None

    def ratios(self) -> Dict[str, object]:
        """The headline ratios: the kernel's fraction of copy bandwidth, the end-to-end call over the kernel
        alone, which pure torch is fastest ("best_torch") and how many times slower it and the others are."""
        fused = self.time_of("fused")
        kernel = self.time_of("fused kernel")
        kernel_gbps = self.gbps_of("fused kernel")
        best = self.best_torch()
        torch_times = [self.time_of(best)] if best else []

        def slower(seconds: Optional[float]) -> Optional[float]:
            return seconds / fused if fused and seconds else None

        return {
            "kernel_fraction_of_copy": kernel_gbps / self.copy_gbps if kernel_gbps else None,
            "kernel_fraction_of_sum": kernel_gbps / self.sum_gbps if kernel_gbps else None,
            "fused_over_kernel": fused / kernel if fused and kernel else None,
            "best_torch": best,
            "best_torch_over_fused": slower(min(torch_times)) if torch_times else None,
            "best_torch_over_kernel": min(torch_times) / kernel if torch_times and kernel else None,
            "reference_over_fused": slower(self.time_of("reference")),
            "dense_over_fused": slower(self.time_of("dense")),
            "heterofl_loop_over_fused": slower(self.time_of("heterofl loop")),
        }

    def as_dict(self) -> dict:
        data = asdict(self)
        data["ratios"] = self.ratios()
        return data


def _synchronize(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def bandwidth_probes(device: str, megabytes: int = 256) -> Tuple[Callable[[], float], Callable[[], float], int]:
    """Timers of a large copy ``y.copy_(x)`` (read + write) and a large ``x.sum()`` (read only).

    Returns ``(time_copy, time_sum, nbytes)``: each timer runs once and returns seconds; the copy moves
    2 * nbytes, the sum reads nbytes. The sum is the ceiling of a read-dominated kernel like this one.
    """
    x = torch.randn(megabytes * 2 ** 20 // 4, device=device)
    y = torch.empty_like(x)

    def timed(action: Callable[[], object]) -> Callable[[], float]:
        def run() -> float:
            _synchronize(device)
            start = time.perf_counter()
            action()
            _synchronize(device)
            return time.perf_counter() - start

        return run

    return timed(lambda: y.copy_(x)), timed(x.sum), x.numel() * x.element_size()


def implementations(federation: Federation, include_slow: bool = True) -> Dict[str, Callable[[], object]]:
    """The timed callables for one federation (fused ones only where the extension is built)."""
    shapes, updates, weights, blocks = federation.shapes, federation.updates, federation.weights, federation.gate_blocks
    runs: Dict[str, Callable[[], object]] = {}
    if ops.available():
        validated = validate_inputs(shapes, updates, weights, blocks)
        layout = ops.build_layout(shapes, updates, blocks)
        first = layout.packed[0]
        out = torch.empty(layout.total_numel, dtype=first.dtype, device=first.device)
        runs["fused kernel"] = lambda: calls.aggregate_into(out, layout.packed, layout.params, layout.entries,
                                                            validated[1])
        runs["fused"] = lambda: aggregate_updates(shapes, updates, weights, blocks, backend="fused")
    runs["torch sliced"] = lambda: aggregate_torch_sliced(shapes, updates, weights, blocks)
    runs["torch stacked"] = lambda: aggregate_torch_stacked(shapes, updates, weights, blocks)
    runs["torch per client"] = lambda: aggregate_torch_per_client(shapes, updates, weights, blocks)
    runs["reference"] = lambda: aggregate_reference(shapes, updates, weights, blocks)
    if include_slow:
        runs["dense"] = lambda: aggregate_dense(shapes, updates, weights, blocks)
        runs["heterofl loop"] = lambda: aggregate_heterofl_loop(shapes, updates, weights, blocks)
    return runs


#: Layouts ``bench aggregate --device cuda`` runs (slice and depth: the dense CUDA kernel; index and mask: the
#: sparse one, csrc/cuda/aggregate_sparse_cuda.cu). Rolling windows' torch competitor is CPU-only.
CUDA_LAYOUTS = ("slice", "depth", "index", "mask")


def run_case(model: str, num_clients: int, device: str = "cpu", repeats: int = 5, budget_s: float = 4.0,
             include_slow: bool = True, seed: int = 0, layout: str = "slice") -> CaseResult:
    """Time every implementation on one federation, interleaved round-robin with the bandwidth probes.

    Each round times the copy, the sum and then every implementation once, so all of them see the same machine
    state (this matters on a shared machine); after one untimed warm-up each, ``repeats`` rounds, except
    that an implementation stops repeating once its timed runs exceed ``budget_s``. Medians are reported.
    """
    if layout == "slice":
        federation = make_federation(model, num_clients, device=device, seed=seed)
        runs = implementations(federation, include_slow)
        packed_bytes = federation.packed_bytes
    else:
        from hasfl_ray.bench.layouts import layout_implementations, make_layout_federation, wire_bytes

        if device != "cpu" and layout not in CUDA_LAYOUTS:
            raise ValueError(f"--layout {layout} runs on the CPU only (its pure-torch competitor is CPU-only); "
                             "expected --device cpu")
        federation = make_layout_federation(model, num_clients, layout, seed=seed, device=device)
        # depth: plain leading tensors (width 1), some names absent: the slice layout's callables
        runs = (implementations(federation, include_slow) if layout == "depth"
                else layout_implementations(federation, layout, include_slow))
        packed_bytes = wire_bytes(federation)
    time_copy, time_sum, probe_bytes = bandwidth_probes(device)
    time_copy(), time_sum()
    for run in runs.values():
        run()
        _synchronize(device)
    samples: Dict[str, List[float]] = {name: [] for name in runs}
    copy_samples: List[float] = []
    sum_samples: List[float] = []
    for _ in range(repeats):
        copy_samples.append(time_copy())
        sum_samples.append(time_sum())
        for name, run in runs.items():
            if samples[name] and sum(samples[name]) > budget_s:
                continue
            _synchronize(device)
            start = time.perf_counter()
            run()
            _synchronize(device)
            samples[name].append(time.perf_counter() - start)
    moved = packed_bytes + federation.output_bytes
    timings = [Timing(model, num_clients, name, statistics.median(times), len(times),
                      moved / statistics.median(times) / 1e9) for name, times in samples.items()]
    return CaseResult(model, num_clients, device, packed_bytes / 1e6, federation.output_bytes / 1e6,
                      2 * probe_bytes / statistics.median(copy_samples) / 1e9,
                      probe_bytes / statistics.median(sum_samples) / 1e9, timings, layout)
