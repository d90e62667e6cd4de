"""Read run directories and reduce them the way the paper reports them."""

from __future__ import annotations

import csv
import io
import json
import os
import reprlib
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
    for key in ("accuracy_at_width_final", "accuracy_at_width_best"):
        if key in summary:
            check_width_map(summary[key], f"{what} has {key}")
    for key in LOCAL_KEYS:
        if key in summary:
            _check_local(summary[key], f"{what} has {key}")


#: A field of a run written before it existed: what its table cell says (never an error).
NOT_RECORDED = "not recorded"
#: summary.json's local accuracy blocks (issue 25): masked, then unmasked.
LOCAL_KEYS = ("local_accuracy", "local_accuracy_unmasked")
#: The statistics of a local accuracy block the fairness table reads.
LOCAL_STATISTICS = ("mean", "worst", "p10", "median")
WIDTHS_EXPECTED = 'an object of widths in (0, 1] ("0.25", "1") to numbers'


def width_of(key: Any) -> Optional[float]:
    """The width a key of an ``accuracy_at_width``-like object names (``format(w, "g")``: "0.25", "1"), None for a
    key that is not a width in (0, 1]."""
    try:
        width = float(key)
    except (TypeError, ValueError):
        return None
    return width if 0 < width <= 1 else None


def _brief(value: Any) -> str:
    """``repr(value)`` cut short (a malformed field may be large)."""
    brief = reprlib.Repr()
    brief.maxstring = brief.maxother = 40
    return brief.repr(value)


def check_width_map(value: Any, what: str, allow_null: bool = False) -> None:
    """One sentence (``what`` names the file and key) unless ``value`` maps widths to numbers (or null, in a
    metrics.jsonl line: a loss that could not be computed)."""
    expected = WIDTHS_EXPECTED + (" or null" if allow_null else "")
    check_number_map(value, what, expected, lambda key: width_of(key) is not None, allow_null)


def check_number_map(value: Any, what: str, expected: str, key_ok=lambda key: True,
                     allow_null: bool = False) -> None:
    """One sentence ``what <value>; expected <expected>`` unless ``value`` is an object whose keys pass ``key_ok``
    and whose values are numbers (or null with ``allow_null``); the sentence shows the first bad entry."""
    if not isinstance(value, dict):
        raise DataError(f"{what} {_brief(value)}; expected {expected}")
    for key, entry in value.items():
        if not key_ok(key) or not (number(entry) or (allow_null and entry is None)):
            raise DataError(f"{what} entry {_brief(key)}: {_brief(entry)}; expected {expected}")


def _check_local(value: Any, what: str) -> None:
    """A local accuracy block: the statistics as numbers, per_tier widths to numbers, width a name; or the text of
    a dataset where it is not defined."""
    if isinstance(value, str):
        return
    expected = (f"an object with {', '.join(LOCAL_STATISTICS)} numbers or null (and per_tier widths to numbers), or the "
                "text \"not defined for this dataset: ...\"")
    if not isinstance(value, dict):
        raise DataError(f"{what} {_brief(value)}; expected {expected}")
    for key in LOCAL_STATISTICS + ("best",):  # null: no client had a test sample of its labels
        if (key in value or key in LOCAL_STATISTICS) and not (number(value.get(key)) or
                                                              (key in value and value[key] is None)):
            raise DataError(f"{what} {key} {_brief(value.get(key))}; expected {expected}")
    if "per_tier" in value:
        check_width_map(value["per_tier"], f"{what} per_tier")
    if "width" in value and not isinstance(value["width"], str):
        raise DataError(f"{what} width {_brief(value['width'])}; expected \"final\" or \"p_max\"")


#: clients.csv columns the reports read as numbers: (column, may be empty).
NUMERIC_CLIENT_COLUMNS = (("p_max", False), ("p_final", False), ("tv_distance", True), ("h_tilde", True))
#: clients.csv columns of issue 25 (per-client local accuracy): numbers or empty, absent from runs written before.
LOCAL_CLIENT_COLUMNS = ("local_accuracy", "local_accuracy_unmasked", "local_width", "local_test_samples")


def read_clients(file: str) -> List[Dict[str, str]]:
    """The rows of a run's clients.csv; one sentence naming the line whose numbers are not numbers."""
    what = f"run file {file!r}"
    text = read_text(file, "run file", "the clients.csv hasfl-ray writes")
    reader = csv.DictReader(io.StringIO(text, newline=""))
    rows = []
    try:
        for row in reader:
            recorded = [(c, True) for c in LOCAL_CLIENT_COLUMNS if c in (reader.fieldnames or ())]
            for column, may_be_empty in NUMERIC_CLIENT_COLUMNS + tuple(recorded):
                value = row.get(column)
                if value is None:
                    raise DataError(f"{what} line {reader.line_num} has no {column}; expected the clients.csv columns "
                                    f"hasfl-ray writes ({', '.join(CLIENT_COLUMNS[:3])}, ...)")
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


def run_groups(runs: Sequence[Dict[str, Any]], order: Sequence[str] = ()) -> List[Tuple[Tuple[str, str], List]]:
    """The runs by (dataset, algorithm label), in the tables' row order: ``order`` (algorithm labels or sweep names,
    e.g. a sweep's algorithm list) within each dataset, then the rest alphabetically."""
    groups: Dict[tuple, List[Dict[str, Any]]] = defaultdict(list)
    for run in runs:
        groups[(run["config"]["dataset"], _label(run["config"]))].append(run)
    rank = {name: i for i, name in enumerate(order)}

    def key(item):
        (dataset, algorithm), members = item
        names = [algorithm] + [_sweep_name(r) for r in members]
        return dataset, min((rank[n] for n in names if n in rank), default=len(rank)), algorithm

    return sorted(groups.items(), key=key)


def mean_std(values: Sequence[float]) -> Tuple[float, float]:
    """Mean and sample standard deviation (0 for one value) over seeds."""
    values = np.asarray(values, dtype=np.float64)
    return float(values.mean()), float(values.std(ddof=1 if len(values) > 1 else 0))


def summarise_runs(runs: Sequence[Dict[str, Any]], order: Sequence[str] = ()) -> List[Dict[str, Any]]:
    """Rows of (dataset, algorithm): seeds, best/final accuracy mean and sample std (×100), the peak-to-final change
    of the means (final − best, the paper's Table 4 column), mean avg_p. Rows follow ``order`` (see
    :func:`run_groups`)."""
    rows = []
    for (dataset, algorithm), members in run_groups(runs, order):
        best_mean, best_std = mean_std([100 * r["summary"]["best_accuracy"] for r in members])
        final_mean, final_std = mean_std([100 * r["summary"]["final_accuracy"] for r in members])
        rows.append({"dataset": dataset, "algorithm": algorithm, "seeds": sorted(r["config"]["seed"] for r in members),
                     "best_mean": best_mean, "best_std": best_std, "final_mean": final_mean, "final_std": final_std,
                     "peak_to_final": final_mean - best_mean,
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
    body = [[display_name(row["dataset"]), display_name(row["algorithm"]) + (" ‡" if row.get("coverage_warnings")
                                                                               else ""),
             algorithm_type(row["algorithm"]), ", ".join(str(s) for s in row["seeds"]),
             f"{row['best_mean']:.1f} ± {row['best_std']:.1f}", f"{row['final_mean']:.1f} ± {row['final_std']:.1f}",
             f"{row['peak_to_final']:+.1f}", f"{row['avg_p']:.2f}"] for row in rows]
    lines = _markdown_grid(["Dataset", "Algorithm", "Type", "Seeds", "Best acc. (%)", "Final acc. (%)",
                            "Peak→final Δ", "Avg. p"], body)
    if any(row.get("coverage_warnings") for row in rows):
        lines += ["", "‡ coverage warning: in these runs part of the global model stayed at its initial value after "
                      "warm-up (no participant covered those coordinates); the frozen fraction is in table.csv."]
    return "\n".join(lines) + "\n"


def _markdown_grid(header: Sequence[str], body: Sequence[Sequence[str]]) -> List[str]:
    """The lines of a markdown table."""
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)] + [
        "| " + " | ".join(cells) + " |" for cells in body]


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
    body = [[_tex(display_name(row["algorithm"])), _tex(algorithm_type(row["algorithm"])),
             rf"{row['best_mean']:.1f} $\pm$ {row['best_std']:.1f}\%",
             rf"{row['final_mean']:.1f} $\pm$ {row['final_std']:.1f}\%", f"${row['peak_to_final']:+.1f}$",
             f"{row['avg_p']:.2f}"] for row in rows]
    return _latex_grid(rows, body, caption, "lllcccc",
                       r"Dataset & Algorithm & Type & Best Acc. & Final Acc. & Peak$\to$final $\Delta$ & Avg.\ $p$")


def _latex_grid(rows: Sequence[Dict[str, Any]], body: Sequence[Sequence[str]], caption: str, align: str,
                header: str) -> str:
    """A booktabs table: each row's dataset named on its first row, a rule between datasets, then ``body``'s
    cells (TeX already)."""
    lines = [r"\begin{table}[!htbp]", r"\centering", rf"\caption{{{_tex(caption)} (mean $\pm$ std over seeds)}}",
             r"\footnotesize", rf"\begin{{tabular}}{{{align}}}", r"\toprule", header + r" \\", r"\midrule"]
    previous = None
    for row, cells in zip(rows, body):
        if previous is not None and row["dataset"] != previous:
            lines.append(r"\midrule")
        dataset = _tex(display_name(row["dataset"])) if row["dataset"] != previous else ""
        previous = row["dataset"]
        lines.append(" & ".join([dataset] + list(cells)) + r" \\")
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


# ------------------------------------------------- issue 25: accuracy at each width, local accuracy, fairness

def _stat(values: Sequence[Any]) -> Any:
    """A cell over seeds: {mean, std, n} (×100, sample std) of the seeds whose value is a number; else the text of
    a seed saying why it is not defined for its dataset; else :data:`NOT_RECORDED` (runs written before)."""
    numbers = [100 * value for value in values if number(value)]
    if numbers:
        mean, std = mean_std(numbers)
        return {"mean": mean, "std": std, "n": len(numbers)}
    return next((value for value in values if isinstance(value, str)), NOT_RECORDED)


def _widths(run: Dict[str, Any], key: str, block: Any = None) -> Dict[float, Any]:
    """summary.json's ``key`` (or ``block``'s, for per_tier) as {width: value}; {} where it is not recorded."""
    value = (run["summary"] if block is None else block).get(key)
    return {width_of(w): v for w, v in value.items()} if isinstance(value, dict) else {}


def _local(run: Dict[str, Any], key: str = "local_accuracy") -> Any:
    """A run's local accuracy block: a dict, the text of a dataset where it is not defined, or None."""
    return run["summary"].get(key)


#: summary.json's local_accuracy width, in words.
LOCAL_WIDTHS = {"final": "its final p", "p_max": "its capacity p^max"}
#: A local accuracy statistic that is null: no client of the run had a test sample of its labels.
NO_CLIENT_SCORED = "no client scored"


def _statistic(block: Any, key: str) -> Any:
    """Statistic ``key`` of a local accuracy block (:data:`NO_CLIENT_SCORED` where null), or the block's text, or
    None (not recorded)."""
    if not isinstance(block, dict):
        return block
    return NO_CLIENT_SCORED if block.get(key) is None else block[key]


def _width_label(width: float) -> str:
    return format(width, "g")


def width_tables(runs: Sequence[Dict[str, Any]], order: Sequence[str] = ()) -> List[Dict[str, Any]]:
    """The tables of issue 25, each ``{"name", "title", "caption", "columns": [(key, markdown, TeX)], "rows"}`` (rows
    as :func:`summarise_runs`'s, with ``cells`` {key: a :func:`_stat` cell}), or ``{"name", "omitted": why}`` when no
    run holds its fields: ``widths`` (final accuracy of the global model cut to each width, FjORD's curve and
    HeteroFL's level table), ``local`` (global against local accuracy, masked and unmasked) and ``fairness`` (the
    masked local accuracy's mean, worst client, 10th percentile, median and per-tier mean)."""
    groups = run_groups(runs, order)
    widths = sorted({w for run in runs for w in _widths(run, "accuracy_at_width_final")})
    tiers = sorted({w for run in runs if isinstance(_local(run), dict) for w in _widths(run, "per_tier", _local(run))})
    tables = []

    def table(name, title, caption, columns, cells, omitted):
        if omitted:
            tables.append({"name": name, "omitted": omitted})
            return
        rows = [{"dataset": dataset, "algorithm": algorithm, "seeds": sorted(r["config"]["seed"] for r in members),
                 "cells": cells(members)} for (dataset, algorithm), members in groups]
        tables.append({"name": name, "title": title, "caption": caption, "columns": columns, "rows": rows})

    table("widths", "Accuracy at each width",
          "Final test accuracy (%) of the global model cut to width p, the sub-model the algorithm hands a client of "
          "that width (docs/metrics.md)",
          [(f"p={_width_label(w)}", f"p = {_width_label(w)}", f"$p={_width_label(w)}$") for w in widths],
          lambda members: {f"p={_width_label(w)}{suffix}": _stat([_widths(r, key).get(w) for r in members])
                           for w in widths for suffix, key in (("", "accuracy_at_width_final"),
                                                               ("_best", "accuracy_at_width_best"))},
          "" if widths else "no run records accuracy_at_width_final in summary.json (runs written before per-width "
                            "evaluation)")
    recorded = any(key in run["summary"] for run in runs for key in LOCAL_KEYS)
    table("local", "Global and local accuracy",
          "Global: final test accuracy (%) of the full-width model; local: mean over clients of the accuracy (%) on "
          "the test samples of the labels each client holds, at its own width, logits masked to those labels or not "
          "(HeteroFL's global and local; docs/metrics.md); a client's width: " + (", ".join(sorted(
              {LOCAL_WIDTHS.get(b.get("width"), str(b.get("width"))) for run in runs for b in [_local(run)]
               if isinstance(b, dict)})) or "not recorded"),
          [("global", "Global acc. (%)", "Global"), ("local", "Local acc., masked (%)", "Local (masked)"),
           ("local_unmasked", "Local acc., unmasked (%)", "Local (unmasked)")],
          lambda members: {"global": _stat([r["summary"]["final_accuracy"] for r in members]),
                           **{name: _stat([_statistic(_local(r, key), "mean") for r in members])
                              for name, key in (("local", "local_accuracy"),
                                                ("local_unmasked", "local_accuracy_unmasked"))}},
          "" if recorded else "no run records local_accuracy in summary.json (runs written before local evaluation)")
    defined = any(isinstance(_local(run), dict) for run in runs)
    table("fairness", "Fairness over clients",
          "Masked local accuracy (%) over clients: mean, worst client, 10th percentile, median, and the mean of each "
          "capacity tier p^max (HASA's worst and tail; docs/metrics.md)",
          [(s, h, h) for s, h in (("mean", "Mean"), ("worst", "Worst"), ("p10", "P10"), ("median", "Median"))]
          + [(f"tier={_width_label(w)}", f"Tier p^max = {_width_label(w)}", rf"$p^{{\max}}={_width_label(w)}$")
             for w in tiers],
          lambda members: {**{s: _stat([_statistic(_local(r), s) for r in members]) for s in LOCAL_STATISTICS},
                           **{f"tier={_width_label(w)}": _stat([_widths(r, "per_tier", b).get(w) if isinstance(b, dict)
                                                                else b for r, b in zip(members, map(_local, members))])
                              for w in tiers}},
          "" if defined else "no run has per-client local accuracies in summary.json (" + (
              "not defined for its dataset" if recorded else "runs written before local evaluation") + ")")
    return tables


def _cell_text(cell: Any, seeds: int, tex: bool = False) -> str:
    """``mean ± std`` (with ``(n/seeds seeds)`` when some seeds did not record it), or the reason there is none."""
    if isinstance(cell, str):
        text = "not defined" if cell.startswith("not defined") else cell
        return _tex(text) if tex else text
    plus_minus = r"$\pm$" if tex else "±"
    text = f"{cell['mean']:.1f} {plus_minus} {cell['std']:.1f}"
    return text + (f" ({cell['n']}/{seeds} seeds)" if cell["n"] < seeds else "")


def _undefined_notes(table: Mapping[str, Any]) -> List[str]:
    """Why the cells saying "not defined" say so (once per reason)."""
    reasons = {cell for row in table["rows"] for cell in row["cells"].values()
               if isinstance(cell, str) and cell.startswith("not defined")}
    return [f"not defined: {reason}" for reason in sorted(reasons)]


def grid_markdown(table: Mapping[str, Any]) -> str:
    """A :func:`width_tables` table in markdown: the caption below it, then why any cell says "not defined"."""
    body = [[display_name(row["dataset"]), display_name(row["algorithm"]), ", ".join(str(s) for s in row["seeds"])]
            + [_cell_text(row["cells"][key], len(row["seeds"])) for key, _, _ in table["columns"]]
            for row in table["rows"]]
    lines = _markdown_grid(["Dataset", "Algorithm", "Seeds"] + [header for _, header, _ in table["columns"]], body)
    lines += ["", table["caption"] + "; mean ± std over seeds."] + [f"- {note}" for note in _undefined_notes(table)]
    return "\n".join(lines) + "\n"


def grid_csv(table: Mapping[str, Any]) -> str:
    """A :func:`width_tables` table as CSV: per cell ``<key>_mean``, ``<key>_std`` and ``<key>_seeds`` (how many
    seeds recorded it); a cell without numbers has its reason in ``<key>_mean``."""
    keys = list(dict.fromkeys(key for row in table["rows"] for key in row["cells"]))
    columns = ["dataset", "algorithm", "seeds"] + [f"{key}_{part}" for key in keys for part in ("mean", "std", "seeds")]
    rows = [{"dataset": row["dataset"], "algorithm": row["algorithm"], "seeds": row["seeds"],
             **{f"{key}_{part}": cell.get(name) if isinstance(cell, dict) else (cell if part == "mean" else None)
                for key, cell in row["cells"].items() for part, name in (("mean", "mean"), ("std", "std"),
                                                                         ("seeds", "n"))}}
            for row in table["rows"]]
    return table_csv(rows, columns)


def grid_latex(table: Mapping[str, Any], caption: str) -> str:
    """A :func:`width_tables` table as a booktabs table in the layout of :func:`table_latex`."""
    body = [[_tex(display_name(row["algorithm"]))]
            + [_cell_text(row["cells"][key], len(row["seeds"]), tex=True) for key, _, _ in table["columns"]]
            for row in table["rows"]]
    header = " & ".join(["Dataset", "Algorithm"] + [tex for _, _, tex in table["columns"]])
    return _latex_grid(table["rows"], body, f"{table['title']}, {caption}" if caption else table["title"],
                       "ll" + "c" * len(table["columns"]), header)


def omitted_lines(tables: Sequence[Mapping[str, Any]]) -> List[str]:
    """One line per :func:`width_tables` table left out, saying why."""
    return [f"{table['name']} table omitted: {table['omitted']}" for table in tables if "omitted" in table]
