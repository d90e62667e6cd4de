"""`data inspect --plot FILE` (issue 45 item 5): the partition as a heat map of clients × labels (each cell the
client's number of training samples of that label), written as PNG, PDF or SVG by FILE's extension."""

from __future__ import annotations

import os
from typing import Any, Dict

import numpy as np

from hasfl_ray.analysis.runfiles import FIGURE_FORMATS, _save
from hasfl_ray.errors import ConfigError


def check_plot_path(path: str) -> str:
    """The figure format of ``path`` (its extension: png, pdf or svg); one sentence when the extension is another
    or its folder is missing, before the data is read."""
    fmt = os.path.splitext(path)[1].lower().lstrip(".")
    if fmt not in FIGURE_FORMATS:
        raise ConfigError(f"--plot is {path!r}; expected a file name ending in "
                          + ", ".join(f".{name}" for name in FIGURE_FORMATS))
    folder = os.path.dirname(path) or "."
    if not os.path.isdir(folder):
        raise ConfigError(f"--plot is {path!r} but its folder {folder!r} does not exist; expected a file in an "
                          "existing folder")
    if os.path.isdir(path):
        raise ConfigError(f"--plot is {path!r}, a folder; expected a file name")
    return fmt


def counts(summary: Dict[str, Any]) -> np.ndarray:
    """The heat map's values: [clients, labels] training-sample counts, from ``data inspect``'s summary."""
    return np.asarray([row["label_histogram"] for row in summary["clients"]], dtype=np.int64)


def plot_partition(summary: Dict[str, Any], path: str, title: str) -> str:
    """Draw ``summary``'s clients × labels heat map (a row per client, a column per label, a colour bar of samples)
    into ``path`` (atomically: a figure is replaced whole); returns the path."""
    fmt = check_plot_path(path)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    values = counts(summary)
    clients, labels = values.shape
    fig, ax = plt.subplots(figsize=(min(4 + 0.25 * labels, 16), min(2.5 + 0.18 * clients, 14)))
    image = ax.imshow(values, aspect="auto", interpolation="nearest", cmap="viridis")
    ax.set(xlabel="label", ylabel="client", title=title)
    if labels <= 40:
        ax.set_xticks(range(labels))
    if clients <= 60:
        ax.set_yticks(range(clients))
        ax.tick_params(axis="y", labelsize=7)
    fig.colorbar(image, ax=ax, label="training samples")
    return _save(fig, os.path.dirname(path) or ".", os.path.basename(path), fmt)
