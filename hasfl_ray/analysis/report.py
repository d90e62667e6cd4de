"""Read run directories and reduce them the way the paper reports them."""

from __future__ import annotations

import csv
import json
import os
from collections import defaultdict
from typing import Any, Dict, List, Sequence

import numpy as np
import yaml
from scipy import stats

from hasfl_ray.errors import ConfigError


def read_run(path: str) -> Dict[str, Any]:
    """config, summary and clients of one finished run directory; one sentence if it is not one."""
    files = {name: os.path.join(path, name) for name in ("config.yaml", "summary.json", "clients.csv")}
    missing = [name for name, file in files.items() if not os.path.isfile(file)]
    if missing:
        raise ConfigError(f"run directory {path!r} has no {missing[0]}; expected a finished hasfl-ray run")
    try:
        with open(files["config.yaml"], encoding="utf-8") as handle:
            config = yaml.safe_load(handle)
        with open(files["summary.json"], encoding="utf-8") as handle:
            summary = json.load(handle)
        with open(files["clients.csv"], encoding="utf-8") as handle:
            clients = list(csv.DictReader(handle))
    except (OSError, ValueError, yaml.YAMLError) as error:
        raise ConfigError(f"run directory {path!r} cannot be parsed ({type(error).__name__}); expected the files "
                          "hasfl-ray writes")
    return {"path": path, "config": config, "summary": summary, "clients": clients}


def _label(config: Dict[str, Any]) -> str:
    label = config["algorithm"]
    if config["algorithm"] == "hasfl" and not config.get("coverage", True):
        label += " (coverage off)"
    return label


def summarise_runs(runs: Sequence[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """Rows of (dataset, algorithm): seeds, best/final accuracy mean and sample std (×100), mean avg_p."""
    groups: Dict[tuple, List[Dict[str, Any]]] = defaultdict(list)
    for run in runs:
        groups[(run["config"]["dataset"], _label(run["config"]))].append(run)
    rows = []
    for (dataset, algorithm), members in sorted(groups.items()):
        best = np.array([100 * r["summary"]["best_accuracy"] for r in members])
        final = np.array([100 * r["summary"]["final_accuracy"] for r in members])
        ddof = 1 if len(members) > 1 else 0
        rows.append({"dataset": dataset, "algorithm": algorithm, "seeds": sorted(r["config"]["seed"] for r in members),
                     "best_mean": float(best.mean()), "best_std": float(best.std(ddof=ddof)),
                     "final_mean": float(final.mean()), "final_std": float(final.std(ddof=ddof)),
                     "avg_p": float(np.mean([r["summary"]["avg_p"] for r in members]))})
    return rows


def partial_correlation(x: np.ndarray, y: np.ndarray, control: np.ndarray) -> float:
    """Pearson correlation of x and y after regressing both linearly on ``control``."""
    design = np.column_stack([np.ones_like(control), control])
    rx = x - design @ np.linalg.lstsq(design, x, rcond=None)[0]
    ry = y - design @ np.linalg.lstsq(design, y, rcond=None)[0]
    if rx.std() == 0 or ry.std() == 0:
        return float("nan")
    return float(stats.pearsonr(rx, ry)[0])


def confound_correlations(run: Dict[str, Any]) -> Dict[str, float]:
    """The paper's Table 5 for one run: r(H̃, p_max), r(H̃, TV | p_max), r(p, TV | p_max)."""
    rows = [r for r in run["clients"] if r.get("h_tilde") not in ("", None)]
    if len(rows) < 4:
        return {}
    h = np.array([float(r["h_tilde"]) for r in rows])
    p_max = np.array([float(r["p_max"]) for r in rows])
    tv = np.array([float(r["tv_distance"]) for r in rows])
    p = np.array([float(r["p_final"]) for r in rows])
    r_h_pmax = float(stats.pearsonr(h, p_max)[0]) if h.std() > 0 and p_max.std() > 0 else float("nan")
    return {"r_h_pmax": r_h_pmax, "r_h_tv_given_pmax": partial_correlation(h, tv, p_max),
            "r_p_tv_given_pmax": partial_correlation(p, tv, p_max)}
