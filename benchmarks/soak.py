"""Soak test (issues 10 and 46): many HAS-FL rounds (continuous widths) on Ray with 2 trainer actors, or on the
local backend; the resident memory of the driver, the server actor and each trainer actor must stay flat (within
``--tolerance`` after warm-up, i.e. at every sample from round ``--warmup`` on, against the sample at that round)
and no process of the run may outlive it. The trainers' model cache is an LRU bounded in bytes (MODEL_CACHE_WEIGHTS
full-width networks' weights, hasfl_ray/training/workspace.py), so continuous widths never accumulate networks: the
local backend's networks and their bytes against the bound are printed with the memory.

    python benchmarks/soak.py [--rounds 500] [--warmup 50] [--every 10] [--tolerance 0.02]          (make soak)
    python benchmarks/soak.py --backend local --dataset emnist --data-dir DIR --local-steps 2 --eval-every 25
                                                                                                    (make soak)

Prints RSS per process at intervals and a verdict; exits 1 when memory grows or a process is left behind.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from arguments import Parser, fraction, integer, refuse  # noqa: E402


def rss_mib(pid: int) -> float:
    """Resident set size of ``pid`` in MiB (from /proc), 0 when it is gone."""
    try:
        with open(f"/proc/{pid}/status", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def descendants(pid: int) -> set:
    children = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", encoding="utf-8") as handle:
                    fields = handle.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if fields[0] != "Z":
                children.setdefault(int(fields[1]), []).append(int(entry))
    found, stack = set(), [pid]
    while stack:
        for child in children.get(stack.pop(), []):
            if child not in found:
                found.add(child)
                stack.append(child)
    return found


def main() -> int:
    parser = Parser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=integer(1), default=500)
    parser.add_argument("--warmup", type=integer(0), default=50, help="rounds before memory must stay flat")
    parser.add_argument("--every", type=integer(1), default=10, help="sample memory every N rounds")
    parser.add_argument("--tolerance", type=fraction, default=0.02, help="allowed growth after warm-up (fraction)")
    parser.add_argument("--backend", choices=("ray", "local"), default="ray")
    parser.add_argument("--dataset", default="digits")
    parser.add_argument("--data-dir", default=None, help="the dataset's folder (emnist: torchvision's EMNIST files)")
    parser.add_argument("--local-steps", type=integer(1), default=None,
                        help="local iterations a client (default: the protocol's epochs); a lighter round that keeps "
                             "every allocation, width and network of the protocol")
    parser.add_argument("--eval-every", type=integer(1), default=None, help="rounds between evaluations at each width")
    parser.add_argument("--eval-samples", type=integer(1), default=None,
                        help="evaluate on a seeded subset of this many test samples (a lighter evaluation)")
    parser.add_argument("--probe-trim", action="store_true",
                        help="also print the driver's RSS after glibc's malloc_trim(0) at each sample: memory that "
                             "malloc_trim returns was free but kept by the allocator, not held by the run")
    args = parser.parse_args()
    if args.warmup >= args.rounds:  # no sample after the warm-up: nothing to judge (an IndexError at the end, before)
        refuse(f"--warmup is {args.warmup} but --rounds is {args.rounds}; expected a warm-up shorter than the run")

    import ray

    from hasfl_ray import allocator
    from hasfl_ray.engine import Engine, RunConfig
    from hasfl_ray.errors import ConfigError
    from hasfl_ray.simulation import quiet_token_notice

    keys = dict(actors=2) if args.backend == "ray" else {}
    keys.update({k: v for k, v in (("local_steps", args.local_steps), ("eval_every", args.eval_every),
                                   ("eval_samples", args.eval_samples)) if v is not None})
    try:  # the config's refusals (a dataset that is not one, ...) before Ray starts or a folder is made
        config = RunConfig(dataset=args.dataset, data_dir=args.data_dir, rounds=args.rounds, backend=args.backend,
                           checkpoint_every=50, **keys)
        allocator.check_variable()
    except ConfigError as error:
        refuse(str(error))
    out = tempfile.mkdtemp(prefix="hasfl-soak-")
    try:
        engine = Engine(config, out_dir=out)
    except ConfigError as error:  # the config resolved (a dataset that is not one, ...): refused, no folder left
        shutil.rmtree(out, ignore_errors=True)
        refuse(str(error))
    quiet_token_notice()
    if args.backend == "ray":
        ray.init(num_cpus=2, include_dashboard=False, logging_level="warning")
    samples = []  # (round, {process: MiB})
    run_round = engine.run_round
    start = time.perf_counter()

    def sample(t):
        """Memory after round ``t`` and what each process handed back after it (hasfl_ray/allocator.py)."""
        places = getattr(engine.backend, "places", [])  # Ray: the trainers, then the server actor if there is one
        trainers = len(getattr(engine.backend, "slots", places))
        names = [f"trainer{i}" for i in range(trainers)] + ["server"]
        memory = {"driver": rss_mib(os.getpid())}
        memory.update({name: rss_mib(place["pid"]) for name, place in zip(names, places)})
        if args.probe_trim:
            import ctypes
            ctypes.CDLL("libc.so.6").malloc_trim(0)
            memory["driver_trimmed"] = rss_mib(os.getpid())
        samples.append((t, memory))
        trainer = getattr(engine.backend, "trainer", None)  # local: its cache's networks
        cached = ""
        if trainer is not None:  # the LRU's networks' weights, within one network of its bound in bytes
            space = trainer.workspace
            cached = (f"  {len(space.cached_widths)} networks cached ({space.cached_bytes / 2 ** 20:.1f} of "
                      f"{space.cache_bound / 2 ** 20:.1f} MiB)")
        cached += f"  trims {allocator.spent['calls']:.0f} ({allocator.spent['seconds']:.2f} s)"
        print(f"round {t:4d}  " + "  ".join(f"{k} {v:7.1f} MiB" for k, v in memory.items())
              + f"{cached}  ({time.perf_counter() - start:6.0f} s)", flush=True)

    def sampled_round(t):
        if t > 0 and (t - 1) % args.every == 0:  # as round t begins: round t-1 and its release are done
            sample(t - 1)
        line = run_round(t)
        if t == args.rounds - 1:  # the last round, while Ray's actors are still up: the driver's release is next
            allocator.release()
            sample(t)
        return line

    engine.run_round = sampled_round
    try:
        summary = engine.run()
    except ConfigError as error:  # refused as the run starts (data that are not there, ...): nothing left behind
        shutil.rmtree(out, ignore_errors=True)
        refuse(str(error))
    wall = time.perf_counter() - start
    if args.backend == "ray":
        ray.shutdown()
    time.sleep(3)
    left = sorted(descendants(os.getpid()))

    print(f"\n{args.rounds} rounds in {wall:.0f} s ({args.rounds / wall:.2f} rounds/s), final accuracy "
          f"{summary['final_accuracy']:.3f}")
    after = [memory for t, memory in samples if t >= args.warmup]
    ok = True
    print(f"{'process':<10} {'at warm-up':>11} {'min after':>10} {'max after':>10} {'growth':>8}")
    for name in after[0]:
        values = [memory[name] for memory in after]
        growth = (max(values) - values[0]) / values[0]
        flat = growth <= args.tolerance
        ok &= flat
        print(f"{name:<10} {values[0]:>9.1f} M {min(values):>8.1f} M {max(values):>8.1f} M {growth:>7.1%}"
              f"{'' if flat else '  GREW'}")
    print(f"processes left after shutdown: {len(left)}" + (f" {left}" if left else ""))
    ok &= not left
    print("verdict: " + ("flat memory, nothing left behind" if ok else "FAILED"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
