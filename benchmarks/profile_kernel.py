"""The fused aggregation kernel alone on a GPU: its device time split from the host's share of a call, checked
against the float64 oracle first (issue 39 item 3).

For each case (model x clients at the paper's tier mix, ``hasfl_ray.bench.aggregate.make_federation``):

- the result of ``torch.ops.hasfl_ray.aggregate_into`` against :func:`aggregate_reference` in float64 (relative
  error of the mean and of both norms; the output poisoned with NaN before the call, so an unwritten element fails);
- the device time of each of the call's kernels (``torch.profiler``, median over the repeats), the whole call timed
  from the host (plan, tables, launches, synchronize), and a device-to-device copy of 256 MiB beside them;
- the bytes that must move (every packed byte read once, the output written once) over the device time of the
  main kernel, as a fraction of the copy's bandwidth (read + written).

    python benchmarks/profile_kernel.py --cases emnist:50,emnist:200,shakespeare:50,shakespeare:200
    ncu --clock-control none -k regex:aggregate_chunks --launch-skip 3 --launch-count 1 \
        python benchmarks/profile_kernel.py --cases emnist:50 --repeats 5 --no-profiler   # one launch profiled

Run where the extension has its CUDA kernel (``hasfl-ray info``); without a GPU it says so in one sentence and exits
2 (``--device cpu`` rehearses the checks there).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from hasfl_ray.aggregation import aggregate_reference, validate_inputs  # noqa: E402
from hasfl_ray.bench.aggregate import MODELS, make_federation  # noqa: E402
from hasfl_ray.bench.federation import check_case_memory  # noqa: E402
from hasfl_ray.errors import ConfigError  # noqa: E402
from hasfl_ray.ops import aggregate as ops  # noqa: E402
from hasfl_ray.ops import calls  # noqa: E402


def copy_gbps(repeats: int = 20) -> float:
    x = torch.randn(64 * 2 ** 20, device="cuda")
    y = torch.empty_like(x)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(repeats + 3):
        start.record()
        y.copy_(x)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return 2 * x.numel() * 4 / statistics.median(times[3:]) / 1e9


def check(federation, out, result) -> dict:
    """Relative errors of the kernel's mean and norms against the float64 oracle."""
    shapes, weights, blocks = federation.shapes, federation.weights, federation.gate_blocks
    updates64 = [{n: t.double().cpu() for n, t in u.items()} for u in federation.updates]
    ref = aggregate_reference(shapes, updates64, weights, blocks)
    flat_ref = torch.cat([ref.delta[n].flatten() for n in shapes])
    flat = out.double().cpu()
    rel = lambda a, b: float((a - b).norm() / b.norm().clamp_min(1e-300))  # noqa: E731
    div_num, div_den = result[0].cpu(), result[1].cpu()
    return {"mean_rel_err": rel(flat, flat_ref) if not torch.isnan(flat).any() else float("nan"),
            "div_num_rel_err": rel(div_num, ref.div_num), "div_den_rel_err": rel(div_den, ref.div_den)}


def run_case(model: str, clients: int, repeats: int, use_profiler: bool, device: str = "cuda",
             check_max_clients: int = 10 ** 9) -> dict:
    federation = make_federation(model, clients, device=device)
    shapes, updates, weights, blocks = federation.shapes, federation.updates, federation.weights, federation.gate_blocks
    weights_t = validate_inputs(shapes, updates, weights, blocks)[1]
    layout = ops.build_layout(shapes, updates, blocks)
    out = torch.full((layout.total_numel,), float("nan"), dtype=torch.float32, device=device)

    def call():
        return calls.aggregate_into(out, layout.packed, layout.params, layout.entries, weights_t)

    result = call()
    sync(device)
    written = not torch.isnan(out).any().item()  # every element written (the output was poisoned)
    errors = (check(federation, layout_output(layout, out, shapes), result) if clients <= check_max_clients
              else {"mean_rel_err": None, "div_num_rel_err": None, "div_den_rel_err": None})
    errors["all_written"] = written
    for _ in range(3):
        call()
    sync(device)
    host = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        sync(device)
        host.append(time.perf_counter() - start)
    # The host's share that is only handing the packed list to the op: the same call refused at its first check
    # (float32 weights), so nothing after the argument conversion runs.
    bad = weights_t.float()
    marshal = []
    for _ in range(repeats):
        start = time.perf_counter()
        try:
            calls.aggregate_into(out, layout.packed, layout.params, layout.entries, bad)
        except RuntimeError:
            pass
        marshal.append(time.perf_counter() - start)
    kernels = {}
    if use_profiler and device == "cuda":
        from torch.profiler import ProfilerActivity, profile
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(repeats):
                call()
            torch.cuda.synchronize()
        per_kernel = {}
        for event in prof.events():
            if event.device_type == torch.autograd.DeviceType.CUDA:
                per_kernel.setdefault(event.name, []).append(event.device_time_total / 1e6)
        kernels = {name.replace("(anonymous namespace)::", "").split("(")[0][:70]: statistics.median(times)
                   for name, times in per_kernel.items()}
    moved = federation.packed_bytes + federation.output_bytes
    main = next((t for name, t in kernels.items() if "aggregate_chunks" in name), None)
    device_total = sum(t for name, t in kernels.items() if "Memcpy" not in name and "memcpy" not in name) or None
    return {"model": model, "clients": clients, "packed_mb": federation.packed_bytes / 1e6,
            "output_mb": federation.output_bytes / 1e6, "entries": int(layout.entries.shape[0]), **errors,
            "call_s": statistics.median(host), "marshal_s": statistics.median(marshal), "kernels_s": kernels, "main_kernel_s": main,
            "device_kernels_s": device_total,
            "main_gbps": moved / main / 1e9 if main else None,
            "call_gbps": moved / statistics.median(host) / 1e9}


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def layout_output(layout, out, shapes):
    """The flat output in ``shapes`` order (the layout's parameter order may differ)."""
    pieces = {}
    for name, offset in zip(layout.names, layout.out_offsets):
        numel = 1
        for s in shapes[name]:
            numel *= s
        pieces[name] = out[offset:offset + numel]
    return torch.cat([pieces[n] for n in shapes])


def parse_cases(parser: argparse.ArgumentParser, value: str):
    """``--cases``: comma-separated MODEL:CLIENTS, MODEL one of ``bench aggregate --models``' and CLIENTS >= 1."""
    cases = []
    for case in value.split(","):
        model, _, clients = case.strip().partition(":")
        if model not in MODELS or not clients.isdigit() or int(clients) < 1:
            parser.error(f"--cases entry {case!r} is not MODEL:CLIENTS; expected one of {', '.join(MODELS)}, a "
                         "colon and a positive number of clients, e.g. emnist:50")
        cases.append((model, int(clients)))
    return cases


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", default="emnist:50,emnist:200,shakespeare:50,shakespeare:200")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--no-profiler", action="store_true", help="skip torch.profiler (under ncu)")
    parser.add_argument("--json", help="also write the rows to this file")
    parser.add_argument("--check-max-clients", type=int, default=10 ** 9,
                        help="compare with the float64 oracle only the cases with at most this many clients")
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"),
                        help="cuda (default), or cpu: a rehearsal of the checks, no figure")
    args = parser.parse_args()
    cases = parse_cases(parser, args.cases)
    if args.repeats < 1:
        parser.error(f"--repeats is {args.repeats}; expected a positive number of timed calls")
    if args.check_max_clients < 0:
        parser.error(f"--check-max-clients is {args.check_max_clients}; expected a number of clients >= 0")
    problem = (None if ops.available() else "needs hasfl_ray._C built (pip install --no-build-isolation -e .)")
    if problem is None and args.device == "cuda" and not torch.cuda.is_available():
        problem = ("--device cuda needs a visible CUDA GPU, but torch.cuda.is_available() is False; expected a GPU "
                   "machine (--device cpu rehearses the checks)")
    elif problem is None and args.device == "cuda" and not ops.cuda_available():
        problem = "--device cuda needs hasfl_ray._C built with its CUDA kernel (hasfl-ray info)"
    if problem:
        print(f"profile_kernel.py: {problem}", file=sys.stderr)
        sys.exit(2)
    try:
        check_case_memory([model for model, _ in cases], [clients for _, clients in cases], args.device)
    except ConfigError as error:
        parser.error(str(error))
    gbps = copy_gbps() if args.device == "cuda" else float("nan")
    rows = []
    name = torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu (rehearsal)"
    print(f"{name}: device-to-device copy {gbps:.0f} GB/s (read + written)")
    for model, clients in cases:
        row = run_case(model, clients, args.repeats, not args.no_profiler, args.device, args.check_max_clients)
        row["copy_gbps"] = gbps
        row["main_fraction_of_copy"] = row["main_gbps"] / gbps if row["main_gbps"] else None
        row["call_fraction_of_copy"] = row["call_gbps"] / gbps
        rows.append(row)
        print(f"{model} x{clients}: {row['packed_mb']:.1f} MB packed, {row['entries']} entries; "
              + (f"errors mean {row['mean_rel_err']:.1e} norms {row['div_num_rel_err']:.1e}/{row['div_den_rel_err']:.1e}; "
                 if row["mean_rel_err"] is not None else "oracle not run; ")
              + f"all written: {row['all_written']}; "
              f"call {row['call_s'] * 1e6:.0f} us ({row['call_fraction_of_copy']:.1%} of copy; handing over the list "
              f"{row['marshal_s'] * 1e6:.0f} us)"
              + (f"; main kernel {row['main_kernel_s'] * 1e6:.0f} us ({row['main_fraction_of_copy']:.1%} of copy)"
                 if row["main_kernel_s"] else "")
              + "".join(f"\n    {name}: {t * 1e6:.1f} us" for name, t in row["kernels_s"].items()), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
