"""Read run directories and reduce them the way the paper reports them."""

from __future__ import annotations

import csv
import io
import json
import os
from collections import defaultdict
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np
import yaml
from scipy import stats

from hasfl_ray.engine.config import migrate_config, strict_yaml_load
from hasfl_ray.engine.rundir import CLIENT_COLUMNS
from hasfl_ray.errors import ConfigError, DataError, OutputError
from hasfl_ray.files import atomic_write, read_json, read_text


def read_run(path: str) -> Dict[str, Any]:
    """config, summary and clients of one finished run directory, each checked for what the reports use; one
    sentence naming the file (and the line, for clients.csv) when it is not what hasfl-ray writes. The config is
    read as YAML data only: nothing it names (a plug-in file) is imported."""
    files = {name: os.path.join(path, name) for name in ("config.yaml", "summary.json", "clients.csv")}
    missing = [name for name, file in files.items() if not os.path.lexists(file)]
    if missing:
        raise ConfigError(f"run directory {path!r} has no {missing[0]}; expected a finished hasfl-ray run")
    config = _read_config(files["config.yaml"])
    summary = read_json(files["summary.json"], "run file", "the summary of a finished hasfl-ray run")
    _check_summary(summary, f"run file {files['summary.json']!r}")
    clients = read_clients(files["clients.csv"])
    return {"path": path, "config": config, "summary": summary, "clients": clients}


def _read_config(file: str) -> Dict[str, Any]:
    """A run's config.yaml (any version, migrated), with the dataset, algorithm and seed the reports group by."""
    what = f"run file {file!r}"
    text = read_text(file, "run file", "the config.yaml hasfl-ray writes")
    try:
        config = strict_yaml_load(text)  # an alias bomb refused like a config file's
    except (yaml.YAMLError, RecursionError) as error:
        raise DataError(f"{what} is not valid YAML ({type(error).__name__}); expected the config.yaml hasfl-ray "
                        "writes") from None
    if not isinstance(config, dict):
        raise DataError(f"{what} is {type(config).__name__}, not a mapping; expected the config.yaml hasfl-ray "
                        "writes")
    config = migrate_config(config, what)  # a run of an earlier version too
    for key, kind, expected in (("dataset", str, "a dataset name"), ("algorithm", str, "an algorithm name"),
                                ("seed", int, "a whole number")):
        value = config.get(key)
        if not isinstance(value, kind) or isinstance(value, bool) or value == "":
            raise DataError(f"{what} has {key} {value!r}; expected {expected}" if key in config else
                            f"{what} has no {key}; expected {expected}")
    return config


def number(value: Any) -> bool:
    """A real number (not a bool): what a run file's numeric fields hold (NaN included)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _check_summary(summary: Any, what: str) -> None:
    """One sentence unless ``summary`` holds the numbers the tables read."""
    if not isinstance(summary, dict):
        raise DataError(f"{what} is a JSON {type(summary).__name__}, not an object; expected the summary of a "
                        "finished hasfl-ray run")
    for key in ("best_accuracy", "final_accuracy", "avg_p"):
        if not number(summary.get(key)):
            raise DataError(f"{what} has {key} {summary[key]!r}; expected a number" if key in summary else
                            f"{what} has no {key}; expected the summary of a finished hasfl-ray run")
    warning = summary.get("coverage_warning")
    if warning and not (isinstance(warning, dict) and number(warning.get("frozen_fraction"))):
        raise DataError(f"{what} has coverage_warning {warning!r}; expected an object with a frozen_fraction number")


#: clients.csv columns the reports read as numbers: (column, may be empty).
NUMERIC_CLIENT_COLUMNS = (("p_max", False), ("p_final", False), ("tv_distance", True), ("h_tilde", True))


def read_clients(file: str) -> List[Dict[str, str]]:
    """The rows of a run's clients.csv; one sentence naming the line whose numbers are not numbers."""
    what = f"run file {file!r}"
    text = read_text(file, "run file", "the clients.csv hasfl-ray writes")
    reader = csv.DictReader(io.StringIO(text, newline=""))
    rows = []
    try:
        for row in reader:
            for column, may_be_empty in NUMERIC_CLIENT_COLUMNS:
                value = row.get(column)
                if value is None:
                    raise DataError(f"{what} line {reader.line_num} has no {column}; expected the columns "
                                    f"{', '.join(CLIENT_COLUMNS)}")
                if not (may_be_empty and value == ""):
                    try:
                        float(value)
                    except ValueError:
                        raise DataError(f"{what} line {reader.line_num} has {column} {value!r}; expected a number"
                                        + (" or nothing" if may_be_empty else "")) from None
            rows.append(row)
    except csv.Error as error:
        raise DataError(f"{what} line {reader.line_num} cannot be parsed ({error}); expected the clients.csv "
                        "hasfl-ray writes") from None
    return rows


def run_option(config: Mapping[str, Any], name: str, default: Any = None) -> Any:
    """An algorithm option of a run's (migrated) config: ``algorithm_options[name]``, else ``default``."""
    options = config.get("algorithm_options")
    return options.get(name, default) if isinstance(options, Mapping) else default


def _label(config: Dict[str, Any]) -> str:
    label = config["algorithm"]
    if config["algorithm"] == "hasfl" and not run_option(config, "coverage", True):
        label += " (coverage off)"
    return label


def summarise_runs(runs: Sequence[Dict[str, Any]], order: Sequence[str] = ()) -> List[Dict[str, Any]]:
    """Rows of (dataset, algorithm): seeds, best/final accuracy mean and sample std (×100), the peak-to-final change
    of the means (final − best, the paper's Table 4 column), mean avg_p. Rows follow ``order`` (algorithm labels or
    sweep names, e.g. a sweep's algorithm list) within each dataset, then the rest alphabetically."""
    groups: Dict[tuple, List[Dict[str, Any]]] = defaultdict(list)
    for run in runs:
        groups[(run["config"]["dataset"], _label(run["config"]))].append(run)
    rank = {name: i for i, name in enumerate(order)}

    def key(item):
        (dataset, algorithm), members = item
        names = [algorithm] + [_sweep_name(r) for r in members]
        return dataset, min((rank[n] for n in names if n in rank), default=len(rank)), algorithm

    rows = []
    for (dataset, algorithm), members in sorted(groups.items(), key=key):
        best = np.array([100 * r["summary"]["best_accuracy"] for r in members])
        final = np.array([100 * r["summary"]["final_accuracy"] for r in members])
        ddof = 1 if len(members) > 1 else 0
        rows.append({"dataset": dataset, "algorithm": algorithm, "seeds": sorted(r["config"]["seed"] for r in members),
                     "best_mean": float(best.mean()), "best_std": float(best.std(ddof=ddof)),
                     "final_mean": float(final.mean()), "final_std": float(final.std(ddof=ddof)),
                     "peak_to_final": float(final.mean() - best.mean()),
                     "avg_p": float(np.mean([r["summary"]["avg_p"] for r in members])),
                     **_coverage_columns(members)})
    return rows


def _coverage_columns(members: Sequence[Dict[str, Any]]) -> Dict[str, Any]:
    """How many of the seeds ended with part of the model never trained (summary.json's ``coverage_warning``, the
    coverage monitor), and their mean frozen fraction (None when none did)."""
    warned = [r["summary"]["coverage_warning"] for r in members if r["summary"].get("coverage_warning")]
    return {"coverage_warnings": len(warned),
            "frozen_fraction": float(np.mean([w["frozen_fraction"] for w in warned])) if warned else None}


def _sweep_name(run: Dict[str, Any]) -> str:
    """The algorithm name a sweep gave the run's cell (``<dataset>-<name>-seed<seed>``), else its algorithm."""
    base = os.path.basename(os.path.normpath(run["path"]))
    prefix, suffix = f"{run['config']['dataset']}-", f"-seed{run['config']['seed']}"
    if base.startswith(prefix) and base.endswith(suffix) and len(base) > len(prefix) + len(suffix):
        return base[len(prefix):-len(suffix)]
    return run["config"]["algorithm"]


def partial_correlation(x: np.ndarray, y: np.ndarray, control: np.ndarray) -> float:
    """Pearson correlation of x and y after regressing both linearly on ``control``."""
    return partial_correlation_test(x, y, control)[0]


def partial_correlation_test(x: np.ndarray, y: np.ndarray, control: np.ndarray) -> Tuple[float, float]:
    """(r, two-sided p-value) of the partial correlation of x and y given one ``control`` variable: the Pearson
    correlation of the residuals of x and y after regressing each linearly on the control; the p-value from
    Student's t with n − 3 degrees of freedom (one more lost to the control than for a plain correlation)."""
    x, y, control = (np.asarray(a, dtype=np.float64) for a in (x, y, control))
    design = np.column_stack([np.ones_like(control), control])
    rx = x - design @ np.linalg.lstsq(design, x, rcond=None)[0]
    ry = y - design @ np.linalg.lstsq(design, y, rcond=None)[0]
    n = len(x)
    if n < 4 or rx.std() < 1e-12 * max(1.0, np.abs(x).max()) or ry.std() < 1e-12 * max(1.0, np.abs(y).max()):
        return float("nan"), float("nan")
    r = float(np.clip(np.corrcoef(rx, ry)[0, 1], -1.0, 1.0))
    dof = n - 3
    t = r * np.sqrt(dof / max(1e-300, 1 - r * r))
    return r, float(2 * stats.t.sf(abs(t), dof))


def correlation_test(x: np.ndarray, y: np.ndarray) -> Tuple[float, float]:
    """(Pearson r, two-sided p-value); NaN for fewer than 3 points or a constant variable."""
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    if len(x) < 3 or x.std() == 0 or y.std() == 0:
        return float("nan"), float("nan")
    result = stats.pearsonr(x, y)
    return float(result[0]), float(result[1])


#: Table 5's correlations: key -> (what, the test on client arrays h, p_max, tv, p).
CONFOUND_KEYS = ("r_h_tv", "r_h_pmax", "r_h_tv_given_pmax", "r_p_tv_given_pmax")
#: Significance level of the verdict.
ALPHA = 0.05


def _client_arrays(clients: Sequence[Dict[str, Any]]):
    # an empty tv_distance: a client the run never sampled, among very many generated on demand (no estimate either)
    rows = [r for r in clients if r.get("h_tilde") not in ("", None) and r.get("tv_distance") not in ("", None)]
    columns = ("h_tilde", "p_max", "tv_distance", "p_final")
    return [np.array([float(r[c]) for r in rows]) for c in columns]


def confound_statistics(clients: Sequence[Dict[str, Any]]) -> Dict[str, Any]:
    """Table 5 over the given clients.csv rows (those with an H̃ estimate): r(H̃, TV), r(H̃, p^max),
    r(H̃, TV | p^max), r(p, TV | p^max), each with its p-value (key ``pvalue_`` + the name without ``r_``), the
    client count ``n_clients`` and a ``verdict``. Empty when fewer than 4 clients have estimates."""
    h, p_max, tv, p = _client_arrays(clients)
    if len(h) < 4:
        return {}
    tests = {"r_h_tv": correlation_test(h, tv), "r_h_pmax": correlation_test(h, p_max),
             "r_h_tv_given_pmax": partial_correlation_test(h, tv, p_max),
             "r_p_tv_given_pmax": partial_correlation_test(p, tv, p_max)}
    result: Dict[str, Any] = {"n_clients": int(len(h))}
    for key, (r, pvalue) in tests.items():
        result[key] = _finite(r)
        result["pvalue_" + key[2:]] = _finite(pvalue)
    result["verdict"] = confound_verdict(result)
    return result


def confound_verdict(result: Mapping[str, Any], alpha: float = ALPHA) -> str:
    """The plain-words reading of Table 5's numbers.

    Capacity signal: r(H̃, p^max) significant at ``alpha``. Data signal: r(H̃, TV | p^max) positive and significant
    (more label skew, larger estimate, beyond what capacity explains). Allocation clause: whether r(p, TV | p^max)
    is positive and significant, i.e. whether widths follow the data."""
    def significant(key: str, positive: bool = False) -> bool:
        r, pvalue = result.get(key), result.get("pvalue_" + key[2:])
        return r is not None and pvalue is not None and pvalue < alpha and (r > 0 or not positive)

    capacity, data = significant("r_h_pmax"), significant("r_h_tv_given_pmax", positive=True)
    if result.get("r_h_pmax") is None and result.get("r_h_tv") is None:
        return (f"no verdict: H̃, TV or p^max does not vary over these clients (n = {result.get('n_clients')}; "
                "before the first adaptation round every H̃ is still 1)")
    if capacity and not data:
        reading = "estimates track capacity, not data"
    elif data and not capacity:
        reading = "estimates track data, not capacity"
    elif data:
        reading = "estimates track both capacity and data"
    else:
        reading = "estimates track neither capacity nor data (no significant correlation)"
    allocation = "allocations follow data beyond capacity" if significant("r_p_tv_given_pmax", positive=True) \
        else "allocations do not follow data beyond capacity"
    return f"{reading}; {allocation} (n = {result.get('n_clients')}, alpha = {alpha})"


def confound_correlations(run: Dict[str, Any]) -> Dict[str, Any]:
    """The paper's Table 5 for one run (see :func:`confound_statistics`); empty for runs without H̃ estimates."""
    return confound_statistics(run["clients"])


def analyze_runs(runs: Sequence[Dict[str, Any]]) -> Dict[str, List[Dict[str, Any]]]:
    """Table 5 per run (runs with H̃ estimates) and pooled over the seeds of each (dataset, algorithm): the clients
    of every seed's run together. ``{"runs": [...], "pooled": [...]}``, each row naming its run(s)."""
    per_run, groups = [], defaultdict(list)
    for run in runs:
        result = confound_correlations(run)
        if not result:
            continue
        config = run["config"]
        per_run.append({"run": run["path"], "dataset": config["dataset"], "algorithm": _label(config),
                        "seed": config["seed"], **result})
        groups[(config["dataset"], _label(config))].append(run)
    pooled = []
    for (dataset, algorithm), members in sorted(groups.items()):
        clients = [c for r in members for c in r["clients"]]
        pooled.append({"dataset": dataset, "algorithm": algorithm,
                       "seeds": sorted(r["config"]["seed"] for r in members),
                       "runs": [r["path"] for r in members], **confound_statistics(clients)})
    return {"runs": per_run, "pooled": pooled}


def write_analysis(run: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    """Add Table 5 for ``run`` as the ``analysis`` block of its summary.json (atomically); returns the block, or
    None for a run without H̃ estimates (its summary is left as it is)."""
    block = confound_correlations(run)
    if not block:
        return None
    summary = dict(run["summary"])
    summary["analysis"] = block
    path = os.path.join(run["path"], "summary.json")
    try:
        atomic_write(path, (json.dumps(summary, indent=2) + "\n").encode())
    except OSError as error:
        raise OutputError(f"summary.json of run {run['path']!r} could not be given its analysis block "
                          f"({error.strerror or type(error).__name__}); it is left as it was (a writable run "
                          "directory is needed)") from None
    run["summary"] = summary
    return block


def _finite(value: float) -> Optional[float]:
    """``value`` as a float, None for NaN (JSON has no NaN)."""
    return None if value is None or not np.isfinite(value) else float(value)


# ------------------------------------------------------------------------------------------- the paper's tables

#: The paper's names for the algorithms (tables and figures; CSV keeps the command-line names).
DISPLAY_NAMES = {"hasfl": "HAS-FL", "hasfl (coverage off)": "HAS-FL, coverage off", "heterofl": "HeteroFL",
                 "fjord": "FjORD", "uniform": "Uniform", "random-budget": "Random-budget", "fedavg": "FedAvg",
                 "fedprox": "FedProx", "scaffold": "SCAFFOLD", "fedrolex": "FedRolex"}
DATASET_NAMES = {"cifar10": "CIFAR-10", "emnist": "EMNIST", "shakespeare": "Shakespeare", "digits": "Digits",
                 "synthetic": "Synthetic"}
#: Table 6's Type column: what each method trains (a plug-in is a sub-model method of its own).
ALGORITHM_TYPES = {"fedavg": "Full-model", "scaffold": "Full-model + CV", "fedprox": "Full-model + prox",
                   "hasfl": "Sub-model (adaptive)", "hasfl (coverage off)": "Sub-model (adaptive)",
                   "random-budget": "Sub-model (random)", "heterofl": "Sub-model (static)",
                   "fjord": "Sub-model (ordered dropout)", "uniform": "Sub-model (uniform)",
                   "fedrolex": "Sub-model (rolling)"}
TABLE_COLUMNS = ("dataset", "algorithm", "type", "seeds", "best_mean", "best_std", "final_mean", "final_std",
                 "peak_to_final", "avg_p", "coverage_warnings", "frozen_fraction")


def algorithm_type(label: str) -> str:
    return ALGORITHM_TYPES.get(label, "Sub-model (plug-in)" if ":" in label else "Sub-model")
CONFOUND_COLUMNS = ("dataset", "algorithm", "seed", "n_clients") + tuple(
    k for key in CONFOUND_KEYS for k in (key, "pvalue_" + key[2:])) + ("verdict",)


def display_name(name: str) -> str:
    return DISPLAY_NAMES.get(name, DATASET_NAMES.get(name, name))


def protocol_line(config: Mapping[str, Any]) -> str:
    """The protocol of a run in a few symbols: N clients, per round, T rounds, K local epochs, Dirichlet alpha."""
    line = (f"N={config.get('clients')}, {config.get('clients_per_round')}/round, T={config.get('rounds')}, "
            f"K={config.get('local_epochs')}")
    if config.get("dataset") not in ("shakespeare",):
        line += f", α={config.get('alpha')}"
    return line


def table_markdown(rows: Sequence[Dict[str, Any]]) -> str:
    """The paper's table layout: Best, Final, Peak→final, Avg p (mean ± std over seeds, accuracies in %); a row
    whose runs kept part of the model untrained after warm-up (the coverage monitor) is marked ‡ and explained."""
    lines = ["| Dataset | Algorithm | Type | Seeds | Best acc. (%) | Final acc. (%) | Peak→final Δ | Avg. p |",
             "|---|---|---|---|---|---|---|---|"]
    marked = False
    for row in rows:
        mark = " ‡" if row.get("coverage_warnings") else ""
        marked = marked or bool(mark)
        lines.append(f"| {display_name(row['dataset'])} | {display_name(row['algorithm'])}{mark} | "
                     f"{algorithm_type(row['algorithm'])} | "
                     f"{', '.join(str(s) for s in row['seeds'])} | {row['best_mean']:.1f} ± {row['best_std']:.1f} | "
                     f"{row['final_mean']:.1f} ± {row['final_std']:.1f} | {row['peak_to_final']:+.1f} | "
                     f"{row['avg_p']:.2f} |")
    if marked:
        lines += ["", "‡ coverage warning: in these runs part of the global model stayed at its initial value after "
                      "warm-up (no participant covered those coordinates); the frozen fraction is in table.csv."]
    return "\n".join(lines) + "\n"


def table_csv(rows: Sequence[Dict[str, Any]], columns: Sequence[str] = TABLE_COLUMNS) -> str:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=list(columns), extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    for row in rows:
        row = {**row, "type": algorithm_type(row["algorithm"])} if "algorithm" in row else row
        writer.writerow({k: (" ".join(str(s) for s in v) if isinstance(v, list) else ("" if v is None else v))
                         for k, v in row.items()})
    return buffer.getvalue()


def table_latex(rows: Sequence[Dict[str, Any]], caption: str) -> str:
    """A booktabs table in the paper's layout (the dataset named on its first row, a rule between datasets)."""
    lines = [r"\begin{table}[!htbp]", r"\centering", rf"\caption{{{_tex(caption)} (mean $\pm$ std over seeds)}}",
             r"\footnotesize",
             r"\begin{tabular}{lllcccc}", r"\toprule",
             r"Dataset & Algorithm & Type & Best Acc. & Final Acc. & Peak$\to$final $\Delta$ & Avg.\ $p$ \\",
             r"\midrule"]
    previous = None
    for row in rows:
        if previous is not None and row["dataset"] != previous:
            lines.append(r"\midrule")
        dataset = _tex(display_name(row["dataset"])) if row["dataset"] != previous else ""
        previous = row["dataset"]
        lines.append(f"{dataset} & {_tex(display_name(row['algorithm']))} & {_tex(algorithm_type(row['algorithm']))} & "
                     rf"{row['best_mean']:.1f} $\pm$ {row['best_std']:.1f}\% & "
                     rf"{row['final_mean']:.1f} $\pm$ {row['final_std']:.1f}\% & ${row['peak_to_final']:+.1f}$ & "
                     rf"{row['avg_p']:.2f} \\")
    lines += [r"\bottomrule", r"\end{tabular}", r"\end{table}"]
    return "\n".join(lines) + "\n"


def confound_markdown(analysis: Mapping[str, List[Dict[str, Any]]]) -> str:
    """Table 5 (per run, then pooled over seeds), each r with its p-value, and the verdict lines."""
    def cell(row, key):
        r, pvalue = row.get(key), row.get("pvalue_" + key[2:])
        return "n/a" if r is None else f"{r:+.2f} (p={pvalue:.3g})" if pvalue is not None else f"{r:+.2f}"

    lines = ["| Run | n | r(H̃, TV) | r(H̃, p^max) | r(H̃, TV \\| p^max) | r(p, TV \\| p^max) |",
             "|---|---|---|---|---|---|"]
    rows = [(f"{display_name(r['dataset'])}, {display_name(r['algorithm'])}, s{r['seed']}", r)
            for r in analysis["runs"]]
    rows += [(f"{display_name(r['dataset'])}, {display_name(r['algorithm'])}, pooled over seeds "
              f"{', '.join(str(s) for s in r['seeds'])}", r) for r in analysis["pooled"] if r.get("n_clients")]
    for name, row in rows:
        lines.append(f"| {name} | {row['n_clients']} | " + " | ".join(cell(row, k) for k in CONFOUND_KEYS) + " |")
    lines.append("")
    lines += [f"- {display_name(r['dataset'])}, {display_name(r['algorithm'])} (pooled): {r['verdict']}"
              for r in analysis["pooled"] if r.get("verdict")]
    return "\n".join(lines) + "\n"


def confound_latex(analysis: Mapping[str, List[Dict[str, Any]]]) -> str:
    lines = [r"\begin{table}[!htbp]", r"\centering",
             r"\caption{Correlations of the final estimates $\tilde{H}_i$ with ground-truth label divergence "
             r"($\mathrm{TV}$) and device capacity ($p^{\max}$).}", r"\scriptsize", r"\setlength{\tabcolsep}{3pt}",
             r"\begin{tabular}{lccccc}", r"\toprule",
             r"Run & $n$ & $r(\tilde{H},\mathrm{TV})$ & $r(\tilde{H},p^{\max})$ & "
             r"$r(\tilde{H},\mathrm{TV}{\mid}p^{\max})$ & $r(p,\mathrm{TV}{\mid}p^{\max})$ \\", r"\midrule"]
    rows = [(f"{display_name(r['dataset'])}, s{r['seed']}", r) for r in analysis["runs"]]
    rows += [(f"{display_name(r['dataset'])}, pooled", r) for r in analysis["pooled"] if r.get("n_clients")]
    for name, row in rows:
        values = " & ".join("--" if row.get(k) is None else f"${row[k]:.2f}$" for k in CONFOUND_KEYS)
        lines.append(f"{_tex(name)} & {row['n_clients']} & {values} \\\\")
    lines += [r"\bottomrule", r"\end{tabular}", r"\end{table}"]
    return "\n".join(lines) + "\n"


def _tex(text: str) -> str:
    return text.replace("\\", r"\textbackslash{}").replace("&", r"\&").replace("%", r"\%").replace("_", r"\_") \
        .replace("#", r"\#")
