"""`hasfl-ray bench aggregate`: the fused aggregation kernel against pure-torch implementations."""

from __future__ import annotations

import json
import sys
import time
from typing import List, Sequence, Tuple

import click
import torch

from hasfl_ray.ops import aggregate as ops
from hasfl_ray.bench.aggregate import CUDA_LAYOUTS, MODELS, CaseResult, check_case_memory, run_case
from hasfl_ray.bench.federation import bytes_per_client
from hasfl_ray.bench.layouts import LAYOUTS, depth_model
from hasfl_ray.cli.common import user_errors
from hasfl_ray.errors import ConfigError

MODEL_LABELS = {"emnist": "EMNIST CNN", "cifar10": "CIFAR-10 CNN", "cifar100": "CIFAR-100 CNN",
                "shakespeare": "Shakespeare LSTM"}


def _once_each(value: str, items: Sequence, what: str) -> Sequence:
    """``items`` (a comma list's), refused where one comes twice: each would run (and print) as a case again."""
    twice = sorted({str(item) for item in items if items.count(item) > 1})
    if twice:
        raise click.BadParameter(f"{value!r} names {', '.join(twice)} more than once; expected each {what} once")
    return items


def _unknown(names: List[str], what: str) -> str:
    """``no model`` (an empty list), ``digits, not a model`` or ``a, b, not layouts``."""
    if not names:
        return f"no {what}"
    return f"{', '.join(names)}, not {f'{what}s' if len(names) > 1 else f'a {what}'}"


def _int_list(ctx, param, value: str) -> List[int]:
    try:
        counts = [int(v) for v in value.split(",") if v.strip()]
    except ValueError:
        counts = []
    if not counts or min(counts) < 1:
        raise click.BadParameter(f"{value!r} is not a comma-separated list of positive client counts, e.g. 10,50,200")
    return _once_each(value, counts, "client count")


def _split_names(value: str, allowed) -> Tuple[List[str], List[str]]:
    """A comma list's names and those of them not in ``allowed``."""
    names = [v.strip() for v in value.split(",") if v.strip()]
    return names, [name for name in names if name not in allowed]


def _model_list(ctx, param, value: str) -> List[str]:
    models, unknown = _split_names(value, MODELS)
    if not models or unknown:
        raise click.BadParameter(f"{value!r} names {_unknown(unknown, 'model')}; expected a "
                                 f"comma-separated subset of {','.join(MODELS)}")
    return _once_each(value, models, "model")


def _has_depths(model: str) -> bool:
    try:
        depth_model(model, choices=MODELS)
    except ValueError:
        return False
    return True


def _layout_list(ctx, param, value: str) -> List[str]:
    """``--layout``: one layout or a comma-separated list of them (each a case of every model and client count)."""
    layouts, unknown = _split_names(value, LAYOUTS)
    if not layouts or unknown:
        raise click.BadParameter(f"{value!r} names {_unknown(unknown, 'layout')}; expected "
                                 f"{', '.join(LAYOUTS[:-1])} or {LAYOUTS[-1]}, or a comma list of them")
    return _once_each(value, layouts, "layout")


def format_case(case: CaseResult) -> str:
    """One case as a text table: median ms, effective GB/s, and how many times slower than fused."""
    fused = case.time_of("fused")
    lines = [f"{MODEL_LABELS.get(case.model, case.model)}, {case.clients} clients on {case.device}, layout "
             f"{case.layout}: packed "
             f"{case.packed_mb:.1f} MB + output {case.output_mb:.1f} MB; large torch copy {case.copy_gbps:.1f} GB/s "
             f"(read + write), sum {case.sum_gbps:.1f} GB/s (read)",
             f"  {'implementation':<18} {'median ms':>10} {'GB/s':>7} {'runs':>5} {'÷ fused':>8}"]
    ratios = case.ratios()
    best = ratios["best_torch"]
    for timing in case.timings:
        ratio = f"{timing.median_s / fused:.1f}×" if fused else "-"
        note = ""
        if timing.implementation == "fused kernel":
            note = f"   {timing.gbps / case.copy_gbps:.0%} of copy, {timing.gbps / case.sum_gbps:.0%} of sum"
        elif timing.implementation == best:
            note = "   best torch"
        lines.append(f"  {timing.implementation:<18} {timing.median_s * 1e3:>10.1f} {timing.gbps:>7.2f} "
                     f"{timing.repeats:>5} {ratio:>8}{note}")
    if ratios["fused_over_kernel"] is not None:
        lines.append(f"  fused end-to-end / kernel alone: {ratios['fused_over_kernel']:.2f}×")
    if ratios["best_torch_over_fused"] is not None:
        lines.append(f"  best torch ({best}) / fused: {ratios['best_torch_over_fused']:.1f}× end to end, "
                     f"{ratios['best_torch_over_kernel']:.1f}× the kernel alone")
    return "\n".join(lines)


def case_line(k: int, plan: Sequence[Tuple[str, int]], elapsed_s: float, layout: str = "") -> str:
    """"case 3 of 9: CIFAR-10 CNN, 200 clients (12.0 s so far, about 40 s left)": the estimate scales the time of
    the cases done by the bytes of updates each case aggregates (clients × a client's update), so a case of 200
    clients counts 20 of 10. ``layout``: named after the clients (several --layout values)."""
    model, clients = plan[k][:2]
    head = f"case {k + 1} of {len(plan)}: {MODEL_LABELS.get(model, model)}, {clients} clients" + \
        (f", layout {layout}" if layout else "")
    if k == 0:
        return head
    size = [entry[1] * bytes_per_client(entry[0]) for entry in plan]
    left = elapsed_s / sum(size[:k]) * sum(size[k:])
    return f"{head} ({_seconds(elapsed_s)} so far, about {_seconds(left)} left)"


def _seconds(s: float) -> str:
    return f"{s:.0f} s" if s < 90 else f"{s / 60:.0f} min" if s < 5400 else f"{s / 3600:.1f} h"


@click.group()
def bench() -> None:
    """Throughput benchmarks (one subcommand each); figures are recorded in benchmarks/RESULTS.md."""


@bench.command("aggregate")
@click.option("--device", type=click.Choice(["cpu", "cuda"]), default="cpu", show_default=True,
              help="Where the client updates live and the kernels run.")
@click.option("--clients", "client_counts", default="10,50,200", show_default=True, callback=_int_list,
              help="Comma-separated numbers of clients per round.")
@click.option("--models", default=",".join(MODELS), show_default=True, callback=_model_list,
              help="Comma-separated models (dataset names).")
@click.option("--repeats", type=click.IntRange(1, 100), default=5, show_default=True,
              help="Timed rounds per case, after one warm-up (slow implementations stop after ~4 s).")
@click.option("--threads", type=click.IntRange(1, 1024), default=None,
              help="torch/OpenMP threads (default: torch's default, all cores).")
@click.option("--layout", "layouts", default="slice", show_default=True, callback=_layout_list,
              metavar="|".join(LAYOUTS) + "[,...]",
              help="Sub-model shape of the updates: slice (leading slices), window (rolling windows, mixed offsets; "
                   "CPU only), index (per-layer channel index sets), mask (unstructured masks) or depth (a prefix "
                   "of the blocks and their exit heads, models with exits: without --models, those of the default "
                   "list); a comma-separated list runs each.")
@click.option("--skip-slow", is_flag=True, help="Leave out the dense and HeteroFL-loop implementations.")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list of cases instead of tables.")
@user_errors
def aggregate(device: str, client_counts: Sequence[int], models: Sequence[str], repeats: int, threads,
              layouts: Sequence[str], skip_slow: bool, as_json: bool) -> None:
    """Time the fused kernel, the pure-torch reference, the best pure-torch code, a dense zero-padded
    implementation and a HeteroFL-style loop at the paper's tier mix; print effective GB/s and ratios."""
    for layout in layouts:
        if layout not in CUDA_LAYOUTS and device != "cpu":
            other = " (or a --layout list without it)" if len(layouts) > 1 else ""
            click.echo(f"Error: --layout {layout} runs on the CPU only (its pure-torch competitor is CPU-only); "
                       f"expected --device cpu{other}", err=True)
            sys.exit(2)
    if device == "cuda" and not torch.cuda.is_available():
        click.echo("Error: --device cuda needs a visible CUDA GPU; torch.cuda.is_available() is False", err=True)
        sys.exit(2)
    if not ops.available():
        click.echo("warning: hasfl_ray._C is not built; timing the pure-torch implementations only", err=True)
    elif device == "cuda" and not ops.cuda_available():
        click.echo("Error: --device cuda needs hasfl_ray._C built with its CUDA kernel "
                   "(pip install --no-build-isolation -e . with a GPU visible, or HASFL_FORCE_CUDA=1)", err=True)
        sys.exit(2)
    depth_models = list(models)
    if "depth" in layouts:
        if click.get_current_context().get_parameter_source("models") == click.core.ParameterSource.DEFAULT:
            # --models not given: the depth layout's cases are the default models that have depths (the default list
            # holds the LSTM, which has none: `--layout depth` alone was refused); a model named is held to it.
            depth_models = [model for model in models if _has_depths(model)]
        for model in depth_models:
            try:
                depth_model(model, choices=MODELS)
            except ValueError as error:
                raise ConfigError(str(error)) from None
    check_case_memory(models, client_counts, device)  # one sentence, never hours of swapping towards terabytes
    if threads:
        torch.set_num_threads(threads)
    cases = []
    plan = [(model, clients, layout) for layout in layouts
            for model in (depth_models if layout == "depth" else models) for clients in client_counts]
    start = time.perf_counter()
    for k, (model, clients, layout) in enumerate(plan):
        # on stderr, so that --json's stdout stays one JSON document
        click.echo(case_line(k, plan, time.perf_counter() - start, layout if len(layouts) > 1 else ""), err=True)
        case = run_case(model, clients, device=device, repeats=repeats, include_slow=not skip_slow,
                        layout=layout)
        cases.append(case)
        if not as_json:
            click.echo(format_case(case) + "\n")
    if as_json:
        click.echo(json.dumps([case.as_dict() for case in cases]))
