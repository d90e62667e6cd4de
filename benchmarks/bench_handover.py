"""Handing the fused ops their lists of packed tensors: torch.ops against hasfl_ray._C's direct entries
(hasfl_ray/ops/calls.py), side by side in one run, per call, on `hasfl-ray bench aggregate`'s EMNIST federations.

Each figure is the median of REPEATS calls that the op refuses at its first check (float32 weights), so nothing after
the hand-over runs: what is left is handing over the lists (torch.ops boxes every tensor). Then one whole call each
way, whose results must be equal bit for bit. Figures: benchmarks/RESULTS.md.

    python benchmarks/bench_handover.py [--clients 50,200] [--layouts slice,mask] [--repeats 30] [--device cpu]
"""

import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from arguments import Parser, integer, integers, names, refuse  # noqa: E402


def main(argv=None) -> int:
    parser = Parser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=integers(1), default="50,200")
    parser.add_argument("--layouts", type=names(("slice", "index", "mask")), default="slice,mask")
    parser.add_argument("--repeats", type=integer(1), default=30)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args(argv)
    layouts, repeats = args.layouts, args.repeats
    if args.device not in ("cpu", "cuda") or (args.device == "cuda" and not torch.cuda.is_available()):
        refuse(f"--device is {args.device!r}; expected cpu, or cuda on a machine with a CUDA device")
    import hasfl_ray._C  # noqa: F401
    from hasfl_ray.aggregation import validate_inputs
    from hasfl_ray.bench.aggregate import make_federation
    from hasfl_ray.bench.layouts import make_layout_federation
    from hasfl_ray.ops import aggregate as ops
    from hasfl_ray.ops import calls
    from hasfl_ray.ops.sparse import build_sparse_layout

    if not ops.available() or not hasattr(sys.modules["hasfl_ray._C"], "aggregate_into"):
        refuse("the direct entries need hasfl_ray._C built from this tree; expected pip install -e . first")
    print(f"{'layout':>6} {'clients':>7} {'tensors':>7} {'torch.ops us':>12} {'direct us':>9} {'ratio':>6}  equal")
    for layout_name in layouts:
        for clients in args.clients:
            if layout_name == "slice":
                f = make_federation("emnist", clients, device=args.device)
                weights = validate_inputs(f.shapes, f.updates, f.weights, f.gate_blocks)[1]
                layout = ops.build_layout(f.shapes, f.updates, f.gate_blocks)
                tensors = len(layout.packed)

                def call(w, direct):
                    out = torch.empty(layout.total_numel, dtype=layout.packed[0].dtype, device=args.device)
                    return out, calls.aggregate_into(out, layout.packed, layout.params, layout.entries, w,
                                                     direct=direct)
            else:
                f = make_layout_federation("emnist", clients, layout_name, device=args.device)
                weights = validate_inputs(f.shapes, f.updates, f.weights, f.gate_blocks)[1]
                layout = build_sparse_layout(f.shapes, f.updates, f.gate_blocks)
                tensors = len(layout.packed) + len(layout.bits)

                def call(w, direct):
                    out = torch.empty(layout.total_numel, dtype=layout.packed[0].dtype, device=args.device)
                    return out, calls.aggregate_sparse_into(out, layout.packed, layout.params, layout.entries, w,
                                                            layout.kinds, layout.bits, layout.rows,
                                                            layout.row_offsets, direct=direct)
            times = {False: [], True: []}
            for _ in range(repeats):
                for direct in (False, True):  # interleaved
                    start = time.perf_counter()
                    try:
                        call(weights.float(), direct)
                    except RuntimeError:
                        pass
                    times[direct].append(time.perf_counter() - start)
            (out_a, a), (out_b, b) = call(weights, False), call(weights, True)
            equal = torch.equal(out_a, out_b) and all(torch.equal(x, y) for x, y in zip(a, b))
            ops_us, direct_us = (1e6 * statistics.median(times[d]) for d in (False, True))
            print(f"{layout_name:>6} {clients:>7} {tensors:>7} {ops_us:>12.1f} {direct_us:>9.1f} "
                  f"{ops_us / direct_us:>5.2f}x  {equal}")
            if not equal:
                return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
