"""A finished run directory read and checked (config.yaml, summary.json, clients.csv); which runs are the seeds of one
row is :mod:`hasfl_ray.analysis.rows`."""

from __future__ import annotations

import csv
import io
import math
import os
import reprlib
from typing import Any, Dict, List, Mapping, Optional, Tuple

import yaml

from hasfl_ray.engine.config import migrate_config, strict_yaml_load
from hasfl_ray.engine.rundir import CLIENT_COLUMNS
from hasfl_ray.errors import ConfigError, DataError
from hasfl_ray.files import read_json, read_text


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


#: The ranges of a run file's numbers (what a run writes; NaN, infinity and anything outside refused by name):
#: (low, high, in words). Accuracies and fractions, widths (an average width may be 0: a round nobody trained),
#: and counts, losses, seconds and bytes, which are never negative.
FRACTION = (0.0, 1.0, "a number in [0, 1]")
NON_NEGATIVE = (0.0, math.inf, "a finite number >= 0")
FINITE = (-math.inf, math.inf, "a finite number")


def in_range(value: Any, bounds: Tuple[float, float, str] = FINITE) -> bool:
    """A finite real number (not a bool) within ``bounds`` (low and high included)."""
    try:
        return number(value) and math.isfinite(value) and bounds[0] <= value <= bounds[1]
    except OverflowError:  # an integer too large for a float
        return False


#: summary.json's numbers the tables read, and their ranges.
SUMMARY_NUMBERS = (("best_accuracy", FRACTION), ("final_accuracy", FRACTION), ("avg_p", FRACTION))


def check_summary(summary: Any, what: str) -> None:
    """One sentence unless ``summary`` is a finished run's: an object holding the numbers the tables read, each in
    its range (:data:`SUMMARY_NUMBERS`; ``{}`` is no finished run); the sweep's reruns read it through here too."""
    if not isinstance(summary, dict):
        raise DataError(f"{what} is a JSON {type(summary).__name__}, not an object; expected the summary of a "
                        "finished hasfl-ray run")
    for key, bounds in SUMMARY_NUMBERS:
        if not in_range(summary.get(key), bounds):
            raise DataError(f"{what} has {key} {_brief(summary[key])}; expected {bounds[2]}" if key in summary else
                            f"{what} has no {key}; expected the summary of a finished hasfl-ray run")
    warning = summary.get("coverage_warning")
    if warning and not (isinstance(warning, dict) and in_range(warning.get("frozen_fraction"), FRACTION)):
        raise DataError(f"{what} has coverage_warning {_brief(warning)}; expected an object with a frozen_fraction "
                        "in [0, 1]")
    for key in ("accuracy_at_width_final", "accuracy_at_width_best"):
        if key in summary:
            check_width_map(summary[key], f"{what} has {key}")
    for key in LOCAL_KEYS:
        if key in summary:
            _check_local(summary[key], f"{what} has {key}")


_check_summary = check_summary  # its former name


#: A field of a run written before it existed: what its table cell says (never an error).
NOT_RECORDED = "not recorded"
#: summary.json's local accuracy blocks (issue 25): masked, then unmasked.
LOCAL_KEYS = ("local_accuracy", "local_accuracy_unmasked")
#: The statistics of a local accuracy block the fairness table reads.
LOCAL_STATISTICS = ("mean", "worst", "p10", "median")
WIDTHS_EXPECTED = 'an object of widths in (0, 1] ("0.25", "1") to a number in [0, 1] each'


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


def check_width_map(value: Any, what: str, allow_null: bool = False, bounds: Tuple[float, float, str] = FRACTION
                    ) -> None:
    """One sentence (``what`` names the file and key) unless ``value`` maps widths to numbers within ``bounds``
    (accuracies by default; or null, in a metrics.jsonl line: a loss that could not be computed)."""
    expected = f'an object of widths in (0, 1] ("0.25", "1") to {bounds[2]} each' + (" or null" if allow_null else "")
    check_number_map(value, what, expected, lambda key: width_of(key) is not None, allow_null, bounds)


def check_number_map(value: Any, what: str, expected: str, key_ok=lambda key: True,
                     allow_null: bool = False, bounds: Tuple[float, float, str] = FINITE) -> None:
    """One sentence ``what <value>; expected <expected>`` unless ``value`` is an object whose keys pass ``key_ok``
    and whose values are finite numbers within ``bounds`` (or null with ``allow_null``); the sentence shows the
    first bad entry."""
    if not isinstance(value, dict):
        raise DataError(f"{what} {_brief(value)}; expected {expected}")
    for key, entry in value.items():
        if not key_ok(key) or not (in_range(entry, bounds) or (allow_null and entry is None)):
            raise DataError(f"{what} entry {_brief(key)}: {_brief(entry)}; expected {expected}")


def _check_local(value: Any, what: str) -> None:
    """A local accuracy block: the statistics as numbers, per_tier widths to numbers, width a name; or the text of
    a dataset where it is not defined."""
    if isinstance(value, str):
        return
    expected = (f"an object with {', '.join(LOCAL_STATISTICS)} numbers in [0, 1] or null (and per_tier widths to "
                "such numbers), or the text \"not defined for this dataset: ...\"")
    if not isinstance(value, dict):
        raise DataError(f"{what} {_brief(value)}; expected {expected}")
    for key in LOCAL_STATISTICS + ("best",):  # null: no client had a test sample of its labels
        if (key in value or key in LOCAL_STATISTICS) and not (in_range(value.get(key), FRACTION) or
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
#: The range of each numeric clients.csv column (a width, a distance or accuracy, a count; H-tilde any finite value).
CLIENT_RANGES = {"p_max": FRACTION, "p_final": FRACTION, "tv_distance": FRACTION, "h_tilde": FINITE,
                 "local_accuracy": FRACTION, "local_accuracy_unmasked": FRACTION, "local_width": FRACTION,
                 "local_test_samples": NON_NEGATIVE}


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
                    bounds = CLIENT_RANGES[column]
                    try:
                        good = in_range(float(value), bounds)
                    except ValueError:
                        good = False
                    if not good:
                        raise DataError(f"{what} line {reader.line_num} has {column} {_brief(value)}; expected "
                                        f"{bounds[2]}" + (" or nothing" if may_be_empty else ""))
            rows.append(row)
    except csv.Error as error:
        raise DataError(f"{what} line {reader.line_num} cannot be parsed ({error}); expected the clients.csv "
                        "hasfl-ray writes") from None
    return rows


def run_option(config: Mapping[str, Any], name: str, default: Any = None) -> Any:
    """An algorithm option of a run's (migrated) config: ``algorithm_options[name]``, else ``default``."""
    options = config.get("algorithm_options")
    return options.get(name, default) if isinstance(options, Mapping) else default
