"""A run's files as the report and its figures read them: metrics.jsonl checked line by line, and a figure written
whole (below both the per-round figures, :mod:`hasfl_ray.analysis.plots`, and the clock's,
:mod:`hasfl_ray.analysis.clocked`)."""

from __future__ import annotations

import io
import os
from typing import Any, Dict, List, Sequence

from hasfl_ray.analysis.runs import FINITE, FRACTION, NON_NEGATIVE, check_number_map, check_width_map, in_range
from hasfl_ray.errors import DataError
from hasfl_ray.files import atomic_write, parse_json, read_text

#: metrics.jsonl keys the figures draw (a number or null on each line).
PLOTTED_KEYS = ("test_accuracy", "test_loss", "mean_h", "avg_p")
#: metrics.jsonl keys of issue 25, absent from runs written before: a number or null, objects of widths to numbers
#: (on evaluation rounds), objects of parameter names to fractions (every round).
NUMBER_KEYS = ("local_accuracy_mean", "local_accuracy_worst")
#: metrics.jsonl keys of a clocked run (issue 26, docs/clock.md), absent without a device population.
CLOCK_NUMBER_KEYS = ("sim_time_s", "round_time_s", "bytes_down", "bytes_up")
WIDTH_KEYS = ("accuracy_at_width", "loss_at_width")
LAYER_KEYS = ("frozen_by_layer", "coverage_by_layer")
#: The range of each number of a metrics.jsonl line that the report reads (NaN and infinity are refused: a run
#: writes null for a value it could not compute).
LINE_RANGES = {"test_accuracy": FRACTION, "test_loss": NON_NEGATIVE, "mean_h": FINITE, "avg_p": FRACTION,
               "local_accuracy_mean": FRACTION, "local_accuracy_worst": FRACTION, "sim_time_s": NON_NEGATIVE, "round_time_s": NON_NEGATIVE,
               "bytes_down": NON_NEGATIVE, "bytes_up": NON_NEGATIVE, "accuracy_at_width": FRACTION,
               "loss_at_width": NON_NEGATIVE, "frozen_by_layer": FRACTION, "coverage_by_layer": FRACTION}


def _metrics(run: Dict[str, Any]) -> List[Dict[str, Any]]:
    """The run's metrics.jsonl lines (read once, kept in ``run["metrics"]``)."""
    if "metrics" not in run:
        run["metrics"] = read_metrics(run["path"])
    return run["metrics"]


def load_metrics(runs: Sequence[Dict[str, Any]]) -> None:
    """Read (and check) every run's metrics.jsonl before a file is written: a bad one is refused with nothing
    written."""
    for run in runs:
        _metrics(run)


def read_metrics(path: str) -> List[Dict[str, Any]]:
    """The lines of run ``path``'s metrics.jsonl; one sentence naming the file and the line that is not a JSON
    object with numbers (or null) for the keys the figures draw."""
    file = os.path.join(path, "metrics.jsonl")
    if not os.path.lexists(file):
        raise DataError(f"run directory {path!r} has no metrics.jsonl; expected a finished hasfl-ray run (the "
                        "figures draw its rounds)")
    expected = "one JSON object per round, as hasfl-ray writes"
    lines = []
    for line_number, line in enumerate(read_text(file, "run file", expected).split("\n"), 1):
        if not line.strip():
            continue
        what = f"run file {file!r} line {line_number}"
        value = parse_json(line, what, expected)
        if not isinstance(value, dict):
            raise DataError(f"{what} is a JSON {type(value).__name__}, not an object; expected {expected}")
        for key in PLOTTED_KEYS + NUMBER_KEYS + CLOCK_NUMBER_KEYS:
            if value.get(key) is not None and not in_range(value[key], LINE_RANGES[key]):
                raise DataError(f"{what} has {key} {value[key]!r}; expected {LINE_RANGES[key][2]} or null")
        for key in WIDTH_KEYS:
            if key in value:
                check_width_map(value[key], f"{what} has {key}", allow_null=True, bounds=LINE_RANGES[key])
        for key in LAYER_KEYS:
            if key in value:
                check_number_map(value[key], f"{what} has {key}", "an object of parameter names to fractions in "
                                 "[0, 1]", bounds=LINE_RANGES[key])
        lines.append(value)
    return lines


#: The figure formats ``report`` and ``plot`` write (``--format``), and the metadata that would make a file differ
#: from run to run (the date) left out, so one set of runs always gives the same bytes.
FIGURE_FORMATS = {"png": {}, "pdf": {"CreationDate": None}, "svg": {"Date": None}}


def _save(fig, out_dir: str, name: str, fmt: str = "png") -> str:
    """``fig`` as ``name`` (its ``.png`` replaced by ``.<fmt>``: png, pdf or svg) under ``out_dir``, written
    atomically; the path."""
    if fmt not in FIGURE_FORMATS:
        raise ValueError(f"figure format {fmt!r}; expected one of {', '.join(FIGURE_FORMATS)}")
    path = os.path.join(out_dir, name[:-len(".png")] + "." + fmt if name.endswith(".png") else name)
    fig.tight_layout()
    buffer = io.BytesIO()
    import matplotlib

    with matplotlib.rc_context({"svg.hashsalt": "hasfl-ray"}):  # the SVG's element ids: the same every time
        fig.savefig(buffer, dpi=120, format=fmt, metadata=FIGURE_FORMATS[fmt] or None)
    atomic_write(path, buffer.getvalue())  # a figure is replaced whole or not at all
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path
