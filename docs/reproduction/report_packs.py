"""make_report.py's part for packs.md: the one-round sample table and the masked-loss ablation, from
results/packs-sample.csv and results/packs-ablation.csv alone (export_runs.py writes them from the run folders of
run.sh's ``packs`` and ``ablation``); and the page sections between packs.md's markers."""

from __future__ import annotations

import json
import os
from collections import defaultdict
from typing import Dict, List

import numpy as np
from scipy import stats

from hasfl_ray.analysis.statistics import paired_comparison

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
#: The projection's assumptions (packs.md, "GPU-hours"): a local SGD step takes STEP_S on an H100 with CUDA graphs,
#: an evaluation pass sustains FLOPS; CIFAR-10 has TRAIN + TEST images; every cell runs SEEDS seeds.
STEP_S, FLOPS, TRAIN, TEST, SEEDS = 0.002, 25e12, 50_000, 10_000, 3
#: Table row -> (pack config, the variants it sums: a name prefix, '' for all).
GPU_ROWS = (("HeteroFL, IID", "pack-heterofl-cifar10", "iid-"), ("HeteroFL, non-IID-2", "pack-heterofl-cifar10",
            "noniid2-"), ("FjORD", "pack-fjord-cifar10", ""), ("FedRolex", "pack-fedrolex-cifar10", ""),
            ("FIARSE-style", "pack-fiarse-protocol", ""))
#: The one pack variant timed on a card (benchmarks/RESULTS.md, "GPU, measured (issue 39)": FjORD's fjord-kd on an
#: H100, 10 clients of 500 images a round, batch 32, so 160 local steps a round): a training round, the extra of a
#: round evaluating five widths (every 10 rounds), the once-a-run local accuracy (seconds).
MEASURED = {"round_s": 7.36, "eval_s": 6.39, "local_s": 1.73, "steps": 160, "rounds": 500, "eval_every": 10}
LEVELS = {"a": 1.0, "b": 0.5, "c": 0.25, "d": 0.125, "e": 0.0625}


def _three(value: str) -> str:
    return "n/a" if value == "" else f"{float(value):.3f}"


def sample_table(rows: List[Dict[str, str]]) -> str:
    """packs.md's one-round table: a row per cell, the pack named on its first row."""
    lines = ["| pack | variant | global accuracy | at the other widths | local | local, unmasked | avg p | wall |",
             "|---|---|---|---|---|---|---|---|"]
    previous = None
    for row in rows:
        widths = {float(w): a for w, a in json.loads(row["accuracy_at_width"]).items()}
        others = ", ".join(f"{w:g}: {a:.3f}" for w, a in sorted(widths.items()) if w != max(widths))
        lines.append(f"| {row['pack'] if row['pack'] != previous else ''} | {row['variant']} | "
                     f"{_three(row['global_accuracy'])} | {others} | {_three(row['local_accuracy'])} | "
                     f"{_three(row['local_accuracy_unmasked'])} | {_three(row['avg_p'])} | "
                     f"{float(row['wall_s']):.0f} s |")
        previous = row["pack"]
    return "\n".join(lines) + "\n"


def sample_note(rows: List[Dict[str, str]]) -> str:
    """Where the table's numbers were made, and each pack's total wall time."""
    walls = defaultdict(float)
    for row in rows:
        walls[row["pack"]] += float(row["wall_s"])
    machines = sorted({row["machine"] for row in rows})
    commits = sorted({row["commit"][:7] for row in rows})
    return (f"Run at commit {', '.join(commits)} on {'; '.join(machines)} (results/packs-sample.csv, with each cell's "
            "params_sha256). Run time a pack (the cells' `wall_s`, start-up not counted): "
            + ", ".join(f"{pack} {wall:.0f} s" for pack, wall in walls.items()) + ".\n")


def ablation_table(rows: List[Dict[str, str]]) -> str:
    """packs.md's ablation table and, below it, masked − unmasked in global accuracy per length, paired by seed."""
    cells = defaultdict(list)
    for row in rows:
        cells[int(row["rounds"]), row["masked_loss"]].append(row)
    seeds = sorted({int(r["seed"]) for r in rows})
    lines = [f"| rounds | masked loss | global, seeds {' / '.join(map(str, seeds))} | global, mean | local (mask at "
             "evaluation), mean | local unmasked, mean |", "|---|---|---|---|---|---|"]
    for (rounds, masked), members in cells.items():
        members = sorted(members, key=lambda r: int(r["seed"]))
        mean = {k: np.mean([float(r[k]) for r in members]) for k in ("final_accuracy", "local_accuracy",
                                                                      "local_accuracy_unmasked")}
        lines.append(f"| {rounds} | {masked} | {' / '.join(_three(r['final_accuracy']) for r in members)} | "
                     f"{mean['final_accuracy']:.3f} | {mean['local_accuracy']:.3f} | "
                     f"{mean['local_accuracy_unmasked']:.3f} |")
    lines.append("")
    for rounds in sorted({r for r, _ in cells}):
        on = [float(r["final_accuracy"]) for r in sorted(cells[rounds, "on"], key=lambda r: int(r["seed"]))]
        off = [float(r["final_accuracy"]) for r in sorted(cells[rounds, "off"], key=lambda r: int(r["seed"]))]
        result = paired_comparison(on, off)
        paired = stats.ttest_rel(on, off).pvalue
        lines.append(f"- {rounds} rounds, global accuracy on − off: {result['mean_diff']:+.3f} "
                     f"[{result['ci_low']:+.3f}, {result['ci_high']:+.3f}] (paired 95 % t interval), paired p "
                     f"{paired:.3f}, Welch p {result['welch_p']:.3f}; the smallest seed on {min(on):.3f}, the largest "
                     f"off {max(off):.3f}.")
    machines = sorted({row["machine"] for row in rows})
    commits = sorted({row["commit"][:7] for row in rows})
    lines.append(f"- Run at commit {', '.join(commits)} on {'; '.join(machines)} (results/packs-ablation.csv).")
    return "\n".join(lines) + "\n"


def pack_cells(name: str) -> List[Dict]:
    """Each variant of a pack config as the config its cells run (the top level under the variant's keys)."""
    import yaml

    with open(os.path.join(ROOT, "configs", f"{name}.yaml"), encoding="utf-8") as handle:
        config = yaml.safe_load(handle)
    sweep = config.pop("sweep")
    return [{**config, **(sweep.get("variants") or {}).get(v, {}), "variant": v} for v in sweep["algorithms"]]


def cell_cost(cell: Dict) -> Dict[str, float]:
    """One cell's local steps and evaluation FLOPs over its rounds, by the engine's rules
    (:func:`hasfl_ray.evaluation.evaluation_round`): the global model's test_accuracy every test_every rounds (default
    1; under sBN after a statistics pass over the training images, none under test-batch statistics), the other
    eval_widths on the rounds that are also eval_every rounds (the dataset's default 5), each with its own pass, and
    both on the first round (test_first) and each of the last test_last rounds."""
    from hasfl_ray.evaluation import evaluation_round
    from hasfl_ray.models import resnet_cost_table

    per_client = cell.get("local_steps") or cell["local_epochs"] * -(-(TRAIN // cell["clients"]) // cell["batch_size"])
    steps = cell["rounds"] * cell["clients_per_round"] * per_client
    mix = cell.get("width_mix")
    top = LEVELS[mix[0]] if cell.get("global_width") == "first" and isinstance(mix, str) else 1.0
    widths = [w for w in cell.get("eval_widths") or [1.0] if w != 1.0]
    flops = {r["p"]: r["flops"] for r in resnet_cost_table(cell["model"], widths=tuple([top] + [top * w for w in widths]))}
    images = TEST if cell.get("sbn_statistics") == "test_batch" else TRAIN + TEST
    rounds = [evaluation_round(t, cell["rounds"], cell.get("test_every") or 1, cell.get("eval_every") or 5,
                               bool(cell.get("test_first")), cell.get("test_last") or 0,
                               cell.get("test_phase")) for t in range(cell["rounds"])]
    evaluations = sum(tested for tested, _ in rounds) * images * flops[top]
    evaluations += sum(both for _, both in rounds) * images * sum(flops[top * w] for w in widths)
    return {"steps": steps, "eval_flops": evaluations}


def gpu_hours() -> str:
    """packs.md's GPU-hours table: per row, the mean cell's local steps and evaluation FLOPs, hours a cell at
    STEP_S a step and FLOPS, cells (variants x SEEDS) and GPU-hours; under it, the measured variant against its
    projection, the HeteroFL pack at the measured step time and row a's training FLOPs."""
    from hasfl_ray.models import resnet_cost_table

    lines = ["| pack | local steps a cell | evaluation a cell | hours a cell | cells | GPU-hours |",
             "|---|---|---|---|---|---|"]
    total_cells = total = 0.0
    for label, name, prefix in GPU_ROWS:
        cells = [cell_cost(c) for c in pack_cells(name) if c["variant"].startswith(prefix)]
        steps = np.mean([c["steps"] for c in cells])
        flops = np.mean([c["eval_flops"] for c in cells])
        hours = (steps * STEP_S + flops / FLOPS) / 3600
        count = SEEDS * len(cells)
        total_cells, total = total_cells + count, total + hours * count
        lines.append(f"| {label} ({len(cells)} variants) | {steps / 1e6:.2f} M: {steps * STEP_S / 3600:.2f} h | "
                     f"{flops / 1e15:.1f} PFLOP: {flops / FLOPS / 3600:.2f} h | {hours:.2f} | {count:.0f} | "
                     f"{hours * count:.1f} |")
    lines.append(f"| all | | | | {total_cells:.0f} | **{total:.1f}** |")
    m = MEASURED
    cell = (m["rounds"] * m["round_s"] + m["rounds"] // m["eval_every"] * m["eval_s"] + m["local_s"]) / 3600
    fjord = [cell_cost(c) for c in pack_cells("pack-fjord-cifar10") if c["variant"] == "fjord-kd"][0]
    projected = (fjord["steps"] * STEP_S + fjord["eval_flops"] / FLOPS) / 3600
    step = m["round_s"] / m["steps"]
    heterofl = {p: [cell_cost(c) for c in pack_cells("pack-heterofl-cifar10") if c["variant"].startswith(p)]
                for p in ("iid-", "noniid2-")}
    slow = {p: SEEDS * sum(c["steps"] * step + c["eval_flops"] / FLOPS for c in cells) / 3600
            for p, cells in heterofl.items()}
    fast = {p: SEEDS * sum(c["steps"] * STEP_S + c["eval_flops"] / FLOPS for c in cells) / 3600
            for p, cells in heterofl.items()}
    steps = SEEDS * sum(c["steps"] for cells in heterofl.values() for c in cells)
    lines += ["", f"- Measured (`fjord-kd`, benchmarks/RESULTS.md): {cell:.2f} h a cell, {SEEDS * cell:.2f} GPU-hours "
              f"for its {SEEDS} seeds, {cell / projected:.1f}x the projection's {projected:.2f} h; a local step took "
              f"{1000 * step:.1f} ms, not {1000 * STEP_S:.0f} ms.",
              f"- At {1000 * step:.1f} ms a step, the HeteroFL pack's {steps / 1e6:.0f} M local steps ({SEEDS} seeds) "
              f"cost about {sum(slow.values()):,.0f} GPU-hours ({slow['iid-']:,.0f} IID + {slow['noniid2-']:,.0f} "
              f"non-IID-2, the evaluation unchanged), {sum(slow.values()) / sum(fast.values()):.0f}x its projection."]
    row_a = next(c for c in pack_cells("pack-heterofl-cifar10") if c["variant"] == "noniid2-a")
    steps, batch = cell_cost(row_a)["steps"], row_a["batch_size"]
    flops = resnet_cost_table(row_a["model"], widths=(1.0,))[0]["flops"]
    train = steps * batch * 3 * flops
    lines.append(f"- Training FLOPs, row a non-IID-2: {steps / 1e6:.1f} M steps x {batch} samples x 3 x "
                 f"{flops / 1e6:.1f} MFLOP = {train / 1e15:.1f} PFLOP, {train / FLOPS / 3600:.2f} h at "
                 f"{FLOPS / 1e12:.0f} TFLOP/s against {steps * STEP_S / 3600:.2f} h of {1000 * STEP_S:.0f} ms steps.")
    return "\n".join(lines) + "\n"


def write(results: str, read_csv) -> Dict[str, str]:
    """The page sections of packs.md ({marker name: text}) the committed results hold."""
    sections = {"packs-gpu-hours": gpu_hours()}
    sample = read_csv(os.path.join(results, "packs-sample.csv"))
    if sample:
        sections["packs-sample"] = sample_table(sample)
        sections["packs-sample-note"] = sample_note(sample)
    ablation = read_csv(os.path.join(results, "packs-ablation.csv"))
    if ablation:
        sections["packs-ablation"] = ablation_table(ablation)
    return sections
