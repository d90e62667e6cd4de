"""What issue 25's evaluation costs a round: accuracy at each width, local accuracy per client, per-layer coverage.

Item 3's targets: evaluation at the default schedule adds at most 10 % to a round of the digits protocol and of the
EMNIST-sample protocol, and local accuracy for 10,000 synthetic clients takes seconds, not minutes.

Every run is a real `hasfl_ray.simulate` run (local backend, its metrics.jsonl written) in this process, with timers
around the calls issue 25 added to a round: the server's per-layer coverage of the aggregate (``layer_coverage``),
``frozen_by_layer``, and the evaluation at each width below 1 (``Server.evaluate_widths``) and local accuracy on
its rounds (``Engine.local_accuracy``), which ``Engine.evaluation_metrics`` ran before evaluation was deferred. A round before issue 25 cost its ``wall_s``
less those calls, so the added share is measured inside each round. Where a flag turns the new evaluation off
(``--eval-widths full``: the full model only, local accuracy at the end, which is the default too), the same run
with it is timed beside the default as well, interleaved repeat by repeat, round by round on the same seed (same
participants, widths and data), and the ratio of the two is printed: it still carries the per-layer coverage and
the final local accuracy, which no flag removes.

- digits: the `hasfl-ray simulate` defaults (digits, HAS-FL, 20 clients, 10 a round; eval_every 1), ``--rounds``
  rounds, the first ``--drop`` dropped; the last round holds the local accuracy at the end.
- EMNIST sample: `--dataset emnist --data-dir DIR` (default `data`, the CLI's root; a small real sample works too;
  skipped with a line where its files are absent), eval_every 5 (its default), ``--emnist-rounds`` rounds (5: one
  evaluation round, the last, which also holds the local accuracy); a round takes ~30-60 s on 2 CPU cores, so it
  is timed once, by the timers alone, unless ``--emnist-ab``.
- synthetic: `--dataset synthetic --clients 10000 --clients-per-round 100`, ``--synthetic-rounds`` rounds, local
  accuracy at the end: the seconds of the local-accuracy step (``Engine.local_accuracy``: the label histograms once,
  one forward pass per distinct sub-model, the per-client counts, the summaries).

- share (issue 46 item 1): the evaluation's share of a round's process CPU time (``time.process_time``: the
  server's evaluation calls and the sBN passes in them, against ``run_round``), before (``--share-before``: ``main``,
  the path before the evaluation's convolutions kept their reordered weights and before it stopped filling new
  tensors with NaN; or ``pre46``, the path before issue 46: the full model in the layout it had, the sBN pass one
  forward a batch; :data:`SHARE_VARIANTS`), test_accuracy every round, and after (the current path: channels-last,
  the sBN pass's batches stacked ``ghost_norm.STACK_SAMPLES`` at a time, ``--share-stack``, packed convolution
  weights, no NaN fill; every round, and amortised over ``--share-test-every`` rounds for EMNIST, over the pack's
  own cadence, HeteroFL's every round, for the pack) on the same round of the same run config, interleaved repeat by
  repeat (with ``--share-processes`` each run in its own process, ``pre46`` without and the others with huge pages
  for large tensors, hasfl_ray/allocator.py): the EMNIST sample (the CLI's EMNIST defaults, the full model only, no
  local accuracy) and configs/pack-heterofl-cifar10.yaml's a-b-c-d-e (fixed) cell on the CIFAR-10 sample (10
  clients, 4 a round), against 10 % and 20 %.

    python benchmarks/bench_eval.py                                  # all four, 3 digits repeats of 30 rounds
    python benchmarks/bench_eval.py --skip digits,emnist,synthetic --share-data-dir DATA
    python benchmarks/bench_eval.py --skip digits,emnist,synthetic --share-data-dir DATA --share-processes
    python benchmarks/bench_eval.py --skip emnist --repeats 5
    python benchmarks/bench_eval.py --skip emnist,synthetic --eval-every 2       # digits at another schedule
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from typing import Dict, Iterator, List, Optional, Sequence

import hasfl_ray
from hasfl_ray.engine import engine as engine_module
from hasfl_ray.engine import server as server_module

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from arguments import Parser, integer, names, refuse  # noqa: E402

#: Item 3's bound on what the default evaluation adds to a round.
TARGET_RATIO = 1.10
EMNIST_FILES = ("emnist-byclass-train-images-idx3-ubyte", "emnist-byclass-test-images-idx3-ubyte")


class Timers:
    """Seconds spent in the wrapped calls, per round (``round`` is the round run_round is in)."""

    def __init__(self) -> None:
        self.round = -1
        self.spent: Dict[int, Dict[str, float]] = defaultdict(lambda: defaultdict(float))

    def wrap(self, owner, name: str, key: str, sets_round: bool = False) -> None:
        original = getattr(owner, name)
        timers = self

        def timed(*args, **kwargs):
            if sets_round:
                timers.round = args[1]  # Engine.run_round(self, t)
            start = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                timers.spent[timers.round][key] += time.perf_counter() - start

        timed.__wrapped__ = original
        setattr(owner, name, timed)


@contextlib.contextmanager
def timed_calls() -> Iterator[Timers]:
    """Wrap issue 25's calls (and run_round, to know the round) for the duration of the block."""
    timers = Timers()
    targets = [(engine_module.Engine, "run_round", "round", True),
               (server_module, "layer_coverage", "coverage_by_layer", False),
               (server_module.Server, "frozen_by_layer", "frozen_by_layer", False),
               (server_module.Server, "evaluate_widths", "widths", False),
               (engine_module.Engine, "local_accuracy", "local", False)]
    saved = [(owner, name, getattr(owner, name)) for owner, name, _, _ in targets]
    for owner, name, key, sets_round in targets:
        timers.wrap(owner, name, key, sets_round)
    try:
        yield timers
    finally:
        for owner, name, original in saved:
            setattr(owner, name, original)


def run(config: Dict[str, object], out: str) -> Dict[str, object]:
    """One timed run: per round its wall_s, the seconds of the new calls in it, and the run's summary."""
    with timed_calls() as timers:
        summary = hasfl_ray.simulate(config, out_dir=out, force=True)
    with open(os.path.join(out, "metrics.jsonl")) as f:
        lines = [json.loads(line) for line in f]
    rounds = []
    for line in lines:
        spent = timers.spent[line["round"]]
        # issue 25's calls: Engine.evaluation_metrics was the widths' and the local accuracy's passes (since gone:
        # evaluation is requested now and recorded later, hasfl_ray/engine/evaluating.py), timed as they are now
        new = spent["coverage_by_layer"] + spent["frozen_by_layer"] + spent["widths"] + spent["local"]
        rounds.append({"wall": line["wall_s"], "new": new, "widths": spent["widths"], "local": spent["local"],
                       "eval_round": "accuracy_at_width" in line})
    shutil.rmtree(out, ignore_errors=True)
    return {"rounds": rounds, "sha": summary["params_sha256"], "summary": summary}


def mean(values: Sequence[float]) -> float:
    return statistics.fmean(values) if values else float("nan")


def protocol(name: str, config: Dict[str, object], repeats: int, drop: int, ab: bool, scratch: str) -> None:
    """The default schedule's added share of a round (timers), and where ``ab``, default vs --eval-widths full."""
    runs = {"default": config, "eval off": {**config, "eval_widths": [1.0]}} if ab else {"default": config}
    results: Dict[str, List[Dict[str, object]]] = {k: [] for k in runs}
    print(f"\n{name}: {json.dumps(config)}")
    print(f"{'repeat':>6}  " + "  ".join(f"{k + ' s/round':>17}" for k in runs) +
          f"  {'new calls s/round':>17}  {'added (timers)':>14}" + (f"  {'A/B ratio':>9}" if ab else ""))
    for repeat in range(repeats):
        row = {}
        for key, cfg in runs.items():
            result = run(cfg, os.path.join(scratch, f"{name}-{key}-{repeat}"))
            results[key].append(result)
            timed = result["rounds"][drop:]
            row[key] = mean([r["wall"] for r in timed])
            if key == "default":
                row["new"] = mean([r["new"] for r in timed])
        base = row["default"] - row["new"]
        print(f"{repeat + 1:>6}  " + "  ".join(f"{row[k]:>17.3f}" for k in runs) +
              f"  {row['new']:>17.4f}  {row['default'] / base:>14.3f}" +
              (f"  {row['default'] / row['eval off']:>9.3f}" if ab else ""), flush=True)
    timed = [r for result in results["default"] for r in result["rounds"][drop:]]
    wall, new = sum(r["wall"] for r in timed), sum(r["new"] for r in timed)
    ratio = wall / (wall - new)
    evals = [r for r in timed if r["eval_round"]]
    last = [result["rounds"][-1] for result in results["default"]]
    print(f"{name}, default schedule, {len(timed)} rounds timed (rounds {drop}-{len(results['default'][0]['rounds']) - 1}"
          f" of each run): {wall / len(timed):.3f} s a round, of which issue 25's calls {new / len(timed):.4f} s "
          f"({100 * new / wall:.1f} %) -> ratio to the round without them {ratio:.3f}: "
          f"{'met' if ratio <= TARGET_RATIO else 'NOT met'} (<= {TARGET_RATIO:.2f})")
    print("  per call, mean a timed round: " + ", ".join(
        f"{k} {mean([results_round(r, k) for r in timed]) * 1e3:.2f} ms" for k in ("coverage", "widths", "local")) +
        f"; evaluation rounds: {len(evals)}, at each width {mean([r['widths'] for r in evals]) * 1e3:.1f} ms on them;"
        f" local accuracy at the end {mean([r['local'] for r in last]) * 1e3:.1f} ms "
        f"(last round {mean([r['wall'] for r in last]):.3f} s)")
    if ab:
        on = mean([r["wall"] for res in results["default"] for r in res["rounds"][drop:]])
        off = mean([r["wall"] for res in results["eval off"] for r in res["rounds"][drop:]])
        print(f"  A/B: default {on:.3f} s a round vs --eval-widths full {off:.3f} s: ratio {on / off:.3f}")
        shas = {r["sha"] for rs in results.values() for r in rs}
        print(f"  params_sha256: {'identical' if len(shas) == 1 else 'DIFFERENT'} across the schedules and repeats "
              f"({', '.join(sorted(s[:12] for s in shas))})")


def results_round(r: Dict[str, object], key: str) -> float:
    if key == "coverage":
        return r["new"] - r["widths"] - r["local"]  # coverage_by_layer + frozen_by_layer (+ evaluation's rest)
    return r[key]


def synthetic(clients: int, per_round: int, rounds: int, repeats: int, scratch: str) -> None:
    """Seconds of the local-accuracy step at the end of a synthetic run of ``clients`` clients."""
    config = dict(dataset="synthetic", clients=clients, clients_per_round=per_round, rounds=rounds, backend="local",
                  checkpoint_every=0)
    print(f"\nsynthetic: {json.dumps(config)}")
    seconds = []
    for repeat in range(repeats):
        result = run(config, os.path.join(scratch, f"synthetic-{repeat}"))
        last = result["rounds"][-1]
        local = last["local"]
        seconds.append(local)
        scored = result["summary"].get("local_accuracy", {})
        print(f"  repeat {repeat + 1}: local accuracy of {clients:,} clients {local:.3f} s (round {rounds - 1}: "
              f"{last['wall']:.2f} s, earlier rounds {mean([r['wall'] for r in result['rounds'][:-1]]):.2f} s); "
              f"clients scored {scored.get('clients') if isinstance(scored, dict) else scored}", flush=True)
    print(f"synthetic, local accuracy for {clients:,} clients: median {statistics.median(seconds):.3f} s "
          f"(min {min(seconds):.3f}): {'seconds, met' if max(seconds) < 60 else 'NOT met (a minute or more)'}")


#: Issue 46 item 1's bounds on the evaluation's share of a round's CPU time: EMNIST's and a ResNet pack's.
SHARE_TARGETS = {"emnist": 0.10, "pack": 0.20}
#: The server calls a round's evaluation makes (their CPU time, outermost call only) and the sBN pass inside them.
EVAL_CALLS = ("evaluate", "evaluate_widths", "evaluate_depths", "test_beats", "test_logits")


@contextlib.contextmanager
def cpu_timed() -> Iterator[Dict[int, Dict[str, float]]]:
    """Process CPU seconds (time.process_time) per round: the round (``run_round``), the evaluation in it (the
    outermost of :data:`EVAL_CALLS`) and the sBN statistics passes in that."""
    spent: Dict[int, Dict[str, float]] = defaultdict(lambda: defaultdict(float))
    state = {"round": -1, "depth": 0}
    saved = []

    def wrap(owner, name, key, outermost=False, sets_round=False):
        original = getattr(owner, name)
        saved.append((owner, name, original))

        def timed(*args, **kwargs):
            if sets_round:
                state["round"] = args[1]
            if outermost:
                state["depth"] += 1
            start = time.process_time()
            try:
                return original(*args, **kwargs)
            finally:
                if outermost:
                    state["depth"] -= 1
                if not outermost or state["depth"] == 0:
                    spent[state["round"]][key] += time.process_time() - start

        setattr(owner, name, timed)

    wrap(engine_module.Engine, "run_round", "round", sets_round=True)
    for name in EVAL_CALLS:
        wrap(server_module.Server, name, "evaluation", outermost=True)
    wrap(server_module.Server, "_statistics", "sbn")
    try:
        yield spent
    finally:
        for owner, name, original in reversed(saved):
            setattr(owner, name, original)


#: The share section's variants: ``pre46`` the path before issue 46 (the full model in the layout it had, the sBN pass
#: one forward a batch, each evaluation batch one forward, no huge pages); ``main`` the path before the convolutions
#: kept their reordered weights and evaluation stopped filling new tensors with NaN (channels-last, the sBN pass's
#: batches stacked ``ghost_norm.STACK_SAMPLES`` at a time, a per-sample evaluation's batches in forwards of
#: :data:`MAIN_PER_SAMPLE_FORWARD`, huge pages); ``after`` the current path (``main`` with
#: hasfl_ray/models/packed_conv.py, unfilled.py, ghost_norm.py's batches written in place, forwards of
#: ``PER_SAMPLE_FORWARD``).
SHARE_VARIANTS = ("pre46", "main", "after")
#: main's (da2a895) forwards of a per-sample CPU evaluation (``PER_SAMPLE_FORWARD`` now 25).
MAIN_PER_SAMPLE_FORWARD = 50


def share_run(config: Dict[str, object], variant: str, out: str) -> Dict[str, object]:
    """One run of ``variant`` (:data:`SHARE_VARIANTS`), CPU timed."""
    from hasfl_ray.engine import eval_layout
    from hasfl_ray.models import ghost_norm, packed_conv, unfilled

    evaluating = importlib.import_module("hasfl_ray.training.evaluate")
    stack, split = ghost_norm.STACK_SAMPLES, evaluating.PER_SAMPLE_FORWARD
    eval_layout.FULL_WIDTH_LAYOUT = "default" if variant == "pre46" else "channels_last"
    ghost_norm.STACK_SAMPLES = 1 if variant == "pre46" else stack
    evaluating.PER_SAMPLE_FORWARD = 0 if variant == "pre46" else MAIN_PER_SAMPLE_FORWARD if variant == "main" else split
    packed_conv.ENABLED = unfilled.EVALUATION_UNFILLED = ghost_norm.WRITE_INTO = \
        variant == "after"
    try:
        with cpu_timed() as spent:
            summary = hasfl_ray.simulate(config, out_dir=out, force=True)
    finally:
        eval_layout.FULL_WIDTH_LAYOUT = "channels_last"
        ghost_norm.STACK_SAMPLES, evaluating.PER_SAMPLE_FORWARD = stack, split
        packed_conv.ENABLED = unfilled.EVALUATION_UNFILLED = ghost_norm.WRITE_INTO = True
    with open(os.path.join(out, "metrics.jsonl")) as f:
        lines = [json.loads(line) for line in f]
    shutil.rmtree(out, ignore_errors=True)
    return {"spent": {t: dict(v) for t, v in spent.items()}, "lines": lines, "sha": summary["params_sha256"]}


def share_call(config: Dict[str, object], variant: str, out: str, processes: bool) -> Dict[str, object]:
    """:func:`share_run` here, or with ``processes`` in a fresh Python process whose torch allocates as the CLI's
    did before issue 46 (``pre46``: THP_MEM_ALLOC_ENABLE=0) or does now (huge pages, hasfl_ray/allocator.py)."""
    if not processes:
        return share_run(config, variant, out)
    import subprocess
    import sys

    env = {**os.environ, "THP_MEM_ALLOC_ENABLE": "0" if variant == "pre46" else "1"}
    request = json.dumps({"config": config, "variant": variant, "out": out})
    done = subprocess.run([sys.executable, os.path.abspath(__file__), "--share-child", request], env=env,
                          capture_output=True, text=True, check=True)
    result = json.loads(done.stdout.strip().splitlines()[-1])
    result["spent"] = {int(t): v for t, v in result["spent"].items()}
    return result


def share(name: str, config: Dict[str, object], every: int, repeats: int, scratch: str,
          processes: bool = False, before_variant: str = "main", start: Optional[int] = None) -> None:
    """The evaluation's share of a round's CPU time, before (``before_variant``, test_accuracy every round) and
    after (the current path; every round, and with test_every ``every``), interleaved, repeat by repeat. Each run
    has two rounds: "before" tests both, "after" (test_every 2) only the last, so its round 0 is a round without
    evaluation (checked) and round 1 is compared, before and after, on the same participants, widths and data: with
    test_every N a round costs its training and the rest (R) plus E f on average, a share of E f / (R + E f), f the
    evaluated rounds' fraction of the paper's T = 200 under test_every N through round ``start`` (1 / N unset;
    41 / 200 for N = 5 through round 1, the paper's configs)."""
    from hasfl_ray.evaluation import evaluation_round

    target = SHARE_TARGETS[name]
    fraction = sum(evaluation_round(t, 200, every, every, test_phase=start)[0] for t in range(200)) / 200
    cadence = f"test_every {every}" + (f" through {start}" if start else "")
    from hasfl_ray.models import ghost_norm

    print(f"\n{name}, evaluation's share of a round's process CPU (target <= {100 * target:.0f} %; before: "
          f"{before_variant}, sBN stack {1 if before_variant == 'pre46' else ghost_norm.STACK_SAMPLES}, after "
          f"{ghost_norm.STACK_SAMPLES}; load average {' '.join(f'{v:.2f}' for v in os.getloadavg())}): "
          f"{json.dumps(config)}")
    print(f"{'repeat':>6}  {'before: round s':>15}  {'eval s':>7}  {'sBN s':>6}  {'share':>6}  {'after: round s':>14}  "
          f"{'eval s':>7}  {'sBN s':>6}  {'share':>6}  {'rest of round s':>15}  {f'share, {cadence}':>22}")
    rows = []
    for repeat in range(repeats):
        before = share_call({**config, "rounds": 2, "test_every": 1}, before_variant,
                            os.path.join(scratch, f"{name}-b"), processes)
        after = share_call({**config, "rounds": 2, "test_every": 2}, "after", os.path.join(scratch, f"{name}-a"),
                           processes)
        b, a = before["spent"][1], after["spent"][1]  # round 1: the same participants, widths and data
        assert after["spent"][0].get("evaluation", 0.0) == 0.0, "round 0 of the test_every 2 run evaluated"
        round_b, eval_b = b["round"], b.get("evaluation", 0.0)
        round_a, eval_a = a["round"], a.get("evaluation", 0.0)
        rest = round_a - eval_a  # round 1 without its evaluation
        amortised = eval_a * fraction / (rest + eval_a * fraction)
        rows.append((eval_b / round_b, eval_a / round_a, amortised))
        same = [(x["test_accuracy"], y["test_accuracy"]) for x, y in zip(before["lines"], after["lines"])][1]
        print(f"{repeat + 1:>6}  {round_b:>15.2f}  {eval_b:>7.2f}  {b.get('sbn', 0.0):>6.2f}  "
              f"{100 * eval_b / round_b:>5.1f}%  {round_a:>14.2f}  {eval_a:>7.2f}  {a.get('sbn', 0.0):>6.2f}  "
              f"{100 * eval_a / round_a:>5.1f}%  "
              f"{rest:>15.2f}  {100 * amortised:>21.1f}%", flush=True)
        print(f"        params_sha256 {'equal' if before['sha'] == after['sha'] else 'DIFFERENT'} "
              f"({before['sha'][:12]}); round 1's test_accuracy before {same[0]} after {same[1]}: "
              f"{'equal' if same[0] == same[1] else 'DIFFERENT'}")
    med = [statistics.median(r[k] for r in rows) for k in range(3)]
    print(f"{name}: median share before {100 * med[0]:.1f} %, after (every round) {100 * med[1]:.1f} %, after with "
          f"{cadence} {100 * med[2]:.1f} %; target {100 * target:.0f} %: every round "
          f"{'met' if med[1] <= target else 'NOT met'}, {cadence} {'met' if med[2] <= target else 'NOT met'}")


def pack_config(data_dir: str) -> Dict[str, object]:
    """configs/pack-heterofl-cifar10.yaml's a-b-c-d-e (fixed) cell on the CIFAR-10 sample, tiny: 10 clients, 4 a
    round, its 5 local epochs of batch 10, its sBN pass (the whole training set, batch 10), no local accuracy."""
    import yaml

    from hasfl_ray.config.sweep_block import single_run_values

    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "configs", "pack-heterofl-cifar10.yaml")
    with open(path, encoding="utf-8") as handle:
        flags = {"algorithm": "iid-a-b-c-d-e-fix"}
        values = single_run_values(yaml.safe_load(handle), flags, path)
    return {**values, **flags, "data_dir": data_dir, "clients": 10, "clients_per_round": 4, "backend": "local",
            "checkpoint_every": 0, "local_eval_clients": "off"}


def main(argv: Optional[Sequence[str]] = None) -> None:
    parser = Parser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=integer(1), default=3, help="Digits repeats (each: default, then eval off).")
    parser.add_argument("--rounds", type=integer(1), default=30, help="Digits rounds a run.")
    parser.add_argument("--drop", type=integer(0), default=2, help="Rounds dropped at the start of each run.")
    parser.add_argument("--eval-every", type=integer(1), default=None,
                        help="The digits runs' eval_every (default: the protocol's, 1).")
    parser.add_argument("--data-dir", default="data")
    parser.add_argument("--emnist-rounds", type=integer(1), default=5)
    parser.add_argument("--emnist-ab", action="store_true", help="Also time EMNIST with --eval-widths full.")
    parser.add_argument("--synthetic-clients", type=integer(100), default=10_000)
    parser.add_argument("--synthetic-rounds", type=integer(1), default=3)
    parser.add_argument("--synthetic-repeats", type=integer(1), default=2)
    parser.add_argument("--skip", type=names(("digits", "emnist", "synthetic", "share"), empty=True), default="",
                        help="Comma list of digits, emnist, synthetic, share to leave out.")
    parser.add_argument("--share-data-dir", default="data",
                        help="The EMNIST and CIFAR-10 samples' root for the share section (issue 46 item 1).")
    parser.add_argument("--share-repeats", type=integer(1), default=1)
    parser.add_argument("--share-stack", type=integer(1), default=None,
                        help="Samples a stacked forward of the sBN pass after (default: ghost_norm.STACK_SAMPLES).")
    parser.add_argument("--share-only", type=names(("emnist", "pack")), default="emnist,pack",
                        help="Comma list of the share section's emnist, pack.")
    parser.add_argument("--share-before", default="main", choices=SHARE_VARIANTS[:2],
                        help="The share section's before: main (the path before packed convolution weights and "
                             "unfilled evaluation memory, the default) or pre46 (the path before issue 46).")
    parser.add_argument("--share-processes", action="store_true",
                        help="Each share run in its own process, before without and after with huge pages.")
    parser.add_argument("--share-child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--share-test-every", type=integer(1), default=5,
                        help="The share section's EMNIST test_every (the pack's is HeteroFL's own: every round).")
    parser.add_argument("--share-test-phase", type=int, default=None,
                        help="A round the EMNIST cadence passes through (1: the paper's configs; default unset).")
    options = parser.parse_args(argv)
    if options.share_child:  # one run of --share-processes: its result as the last line
        request = json.loads(options.share_child)
        print(json.dumps(share_run(request["config"], request["variant"], request["out"])))
        return
    if options.drop >= options.rounds and "digits" not in options.skip:  # no round left to time
        refuse(f"--drop is {options.drop} but --rounds is {options.rounds}; expected fewer rounds dropped than run")
    skip = set(options.skip)
    scratch = tempfile.mkdtemp(prefix="bench-eval-")
    try:
        if "digits" not in skip:
            digits = dict(rounds=options.rounds, backend="local", checkpoint_every=0)
            if options.eval_every is not None:
                digits["eval_every"] = options.eval_every
            protocol("digits", digits, options.repeats, options.drop, True, scratch)
        if "emnist" not in skip:
            raw = os.path.join(options.data_dir, "EMNIST", "raw")
            if all(os.path.exists(os.path.join(raw, f)) or os.path.exists(os.path.join(raw, f + ".gz"))
                   for f in EMNIST_FILES):
                protocol("emnist", dict(dataset="emnist", data_dir=options.data_dir, rounds=options.emnist_rounds,
                                        backend="local", checkpoint_every=0), 1, 0, options.emnist_ab, scratch)
            else:
                print(f"\nemnist: skipped, the EMNIST sample is not under {raw} (pass --data-dir)")
        if "share" not in skip:
            emnist = dict(dataset="emnist", data_dir=options.share_data_dir, backend="local", checkpoint_every=0,
                          eval_widths=[1.0], local_eval_clients="off")
            from hasfl_ray.models import ghost_norm

            if options.share_stack is not None:
                ghost_norm.STACK_SAMPLES = options.share_stack
            only = set(options.share_only)
            if "emnist" in only:
                share("emnist", emnist, options.share_test_every, options.share_repeats, scratch,
                      options.share_processes, options.share_before, options.share_test_phase)
            if "pack" in only:
                share("pack", pack_config(options.share_data_dir), 1, options.share_repeats, scratch,
                      options.share_processes, options.share_before)
        if "synthetic" not in skip:
            synthetic(options.synthetic_clients, 100, options.synthetic_rounds, options.synthetic_repeats, scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
