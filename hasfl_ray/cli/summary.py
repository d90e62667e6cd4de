"""What `hasfl-ray simulate` prints when a run ends: a short readable summary of its summary.json (final and best
accuracy, accuracy at each evaluated width, local accuracy, simulated time and bytes where clocked,
params_sha256, the run directory); ``--json`` prints summary.json itself instead (docs/cli.md)."""

from __future__ import annotations

from typing import Any, List, Mapping, Optional, Tuple

#: The width of the labels' column.
LABEL_WIDTH = 16


def _percent(value: Any) -> str:
    return f"{100 * value:.2f} %" if isinstance(value, (int, float)) and value == value else "n/a"


def _widths(values: Any) -> Optional[str]:
    """``p=0.25 41.20 %, ..., p=1 81.25 %`` of an accuracy_at_width object, None without one (or one width only)."""
    if not isinstance(values, Mapping) or len(values) < 2:
        return None
    return ", ".join(f"p={width} {_percent(value)}" for width, value in values.items())


def _local(block: Any) -> Optional[str]:
    """The local accuracy line: mean and worst over the clients scored and how they were chosen, the reason it was
    not computed, or None when the run has none."""
    if block is None:
        return None
    if isinstance(block, str):
        return block.split(":")[0]  # "not defined for this dataset", "not computed (local_eval_clients off)"
    if not isinstance(block, Mapping):
        return None
    if block.get("mean") is None:
        return "no client had a test sample of its labels"
    width = {"final": "its final width", "p_max": "its p^max", "global": "the full width"}.get(
        str(block.get("width")), str(block.get("width")))
    clients = block.get("clients")
    line = f"mean {_percent(block['mean'])}, worst {_percent(block.get('worst'))} over {clients:,} clients" \
        if isinstance(clients, int) else f"mean {_percent(block['mean'])}, worst {_percent(block.get('worst'))}"
    line += f" ({'masked to its labels, ' if block.get('masked') else ''}each at {width})"
    sample = block.get("sample")
    return line + (f"\n{'':<{LABEL_WIDTH + 2}}clients: {sample}" if isinstance(sample, str) and sample != "every client"
                   else "")


def _bytes(gigabytes: Any) -> str:
    """``gigabytes`` GB in the unit that suits it, 3 significant figures: ``1.5 GB``, ``500 MB``, ``400 kB``."""
    if not isinstance(gigabytes, (int, float)):
        return "n/a"
    count, unit = gigabytes * 1e9, "bytes"
    for unit in ("bytes", "kB", "MB", "GB", "TB"):
        if count < 1000 or unit == "TB":
            break
        count /= 1000
    return f"{count:.3g} {unit}"


def _clock(summary: Mapping[str, Any]) -> Optional[str]:
    """Simulated time and bytes of a clocked run, None otherwise."""
    hours = summary.get("sim_hours")
    if hours is None and "sim_gb" not in summary:
        return None
    time = "n/a" if not isinstance(hours, (int, float)) else \
        f"{hours:.3g} h" if hours >= 1 else f"{hours * 60:.3g} min" if hours * 60 >= 1 else f"{hours * 3600:.3g} s"
    line = f"{time}; {_bytes(summary.get('sim_gb'))} moved ({_bytes(summary.get('sim_gb_down'))} down, " \
           f"{_bytes(summary.get('sim_gb_up'))} up)"
    lost = [f"{summary[key]} {key.split('_')[0]}" for key in ("late_updates", "dropped_updates", "partial_updates")
            if summary.get(key)]
    return line + (f"; updates {', '.join(lost)}" if lost else "")


def readable_summary(summary: Mapping[str, Any], run_dir: str, algorithm: str, dataset: str, seed: int,
                     precision: str = "fp32") -> str:
    """The lines `simulate` ends with (see the module docstring); ``precision``: the run's ``--precision``, named
    in the first line where it is not fp32 (a bf16 run's accuracy is not an fp32 run's)."""
    rows: List[Tuple[str, str]] = [("accuracy", f"final {_percent(summary.get('final_accuracy'))}, best "
                                      f"{_percent(summary.get('best_accuracy'))}")]
    losses = [f"{name} {summary[key]:.4f}" for name, key in (("test", "final_test_loss"),
                                                             ("training", "final_train_loss"))
              if isinstance(summary.get(key), (int, float))]
    if losses:  # the final round's: the full model's test loss, the mean of its clients' training losses
        rows.append(("loss", ", ".join(losses) + " (final round)"))
    final, best = _widths(summary.get("accuracy_at_width_final")), _widths(summary.get("accuracy_at_width_best"))
    if final:
        rows.append(("at each width", f"{final} (final)"))
        if best and best != final:
            rows.append(("", f"{best} (best)"))
    depths = summary.get("accuracy_at_depth_final")  # depth sub-models: every exit
    if isinstance(depths, Mapping) and depths:
        rows.append(("at each depth", ", ".join(f"d={d} {_percent(v)}" for d, v in depths.items()) + " (final)"))
    local = _local(summary.get("local_accuracy"))
    if local:
        rows.append(("local accuracy", local))
    clock = _clock(summary)
    if clock:
        rows.append(("simulated time", clock))
    stopped = summary.get("stopped_early")  # dp_epsilon's or a callback's stop, before --rounds
    if isinstance(stopped, Mapping) and isinstance(stopped.get("round"), int):
        rows.append(("stopped early", f"after round {stopped['round'] + 1}: {stopped.get('reason')}"))
    if summary.get("coverage_warning"):
        rows.append(("warning", str(summary["coverage_warning"])))
    if summary.get("inputs_unverified"):
        rows.append(("inputs", str(summary["inputs_unverified"])))
    rows += [("params_sha256", str(summary.get("params_sha256"))), ("run directory", run_dir)]
    wall = summary.get("wall_s")
    done = f"{summary.get('rounds')} rounds" if summary.get("mode") != "async" else \
        (f"{summary.get('server_updates')} server updates ({summary.get('async_rule')}, "
         f"staleness mean {summary.get('staleness_mean', 0):.2f}, max {summary.get('staleness_max')})")
    startup = summary.get("startup_s")  # data, model and Ray, timed apart from the rounds
    arithmetic = "" if precision == "fp32" else f", {precision} autocast"
    head = f"{algorithm} on {dataset}, seed {seed}{arithmetic}: {done}" + \
        (f" in {wall:.1f} s" if isinstance(wall, (int, float)) else "") + \
        (f" (+{startup:.1f} s start-up)" if isinstance(startup, (int, float)) else "")
    return "\n".join([head] + [f"  {label:<{LABEL_WIDTH}}{text}" for label, text in rows])
