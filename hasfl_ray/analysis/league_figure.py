"""The league figure: per dataset, one row of panels per cell (partition, width ladder), accuracy against simulated
time (left) and against bytes moved (right), a line per method (mean over seeds, ± std band), the budgets dashed."""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Sequence

from hasfl_ray.analysis.clocked import BYTE_UNITS, TIME_UNITS, _step_curves, _unit, clock_line, is_clocked, trajectory
from hasfl_ray.analysis.league import league_groups
from hasfl_ray.analysis.runfiles import _save
from hasfl_ray.analysis.tables.layout import display_name


def plot_league(runs: Sequence[Dict[str, Any]], out_dir: str, table: Mapping[str, Any],
                order: Sequence[str] = (), fmt: str = "png") -> List[str]:
    """<dataset>-league.<fmt> (png, pdf or svg) for each dataset with a clocked run; returns the paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cells: Dict[str, Dict[tuple, Dict[str, list]]] = {}
    for (dataset, partition, ladder, method), members in league_groups(runs, order):
        clocked = [run for run in members if is_clocked(run)]
        if clocked:
            cells.setdefault(dataset, {}).setdefault((partition, ladder), {})[method] = clocked
    written = []
    for dataset, panels in cells.items():
        every = [run for methods in panels.values() for members in methods.values() for run in members]
        budget = table["budgets"][dataset]
        ends = [trajectory(run) for run in every]
        unit = (_unit(max(max(p[0][-1] for p in ends), budget["time"]), TIME_UNITS),
                _unit(max(max(p[1][-1] for p in ends), budget["bytes"]), BYTE_UNITS))
        fig, axes = plt.subplots(len(panels), 2, figsize=(12, 3.6 * len(panels)), squeeze=False)
        for row, ((partition, ladder), methods) in enumerate(panels.items()):
            for axis in (0, 1):
                ax = axes[row][axis]
                for method, members in methods.items():
                    grid, mean, std = _step_curves(members, axis)
                    line, = ax.plot(grid / unit[axis][0], mean,
                                    label=f"{display_name(method)} ({len(members)} seed{'s' * (len(members) > 1)})")
                    if len(members) > 1:
                        ax.fill_between(grid / unit[axis][0], mean - std, mean + std, color=line.get_color(),
                                        alpha=0.2, linewidth=0)
                ax.axvline(budget["time" if axis == 0 else "bytes"] / unit[axis][0], color="grey", linestyle="--",
                           linewidth=1, label="budget")
                ax.set(xlabel=(f"simulated time ({unit[0][1]})" if axis == 0 else
                               f"data moved, down and up ({unit[1][1]})"),
                       ylabel="test accuracy (%)", title=f"{partition}, {ladder}")
                ax.legend(fontsize=7)
        devices = "; ".join(sorted({clock_line(run["config"]) for run in every}))
        fig.suptitle(f"The sub-model league: {display_name(dataset)} (mean ± std over seeds)\n{devices}", fontsize=10)
        written.append(_save(fig, out_dir, f"{dataset}-league.png", fmt))
    return written
