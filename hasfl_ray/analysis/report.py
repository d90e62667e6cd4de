"""Read run directories and reduce them the way the paper reports them: the names the report has always been imported
by (reading and checking runs: :mod:`~hasfl_ray.analysis.runs`; the runs of each row: :mod:`~hasfl_ray.analysis.rows`;
statistics: :mod:`~hasfl_ray.analysis.statistics`; each table: :mod:`hasfl_ray.analysis.tables`), and a run's Table 5
written into its summary.json."""

from __future__ import annotations

import json
import os
from typing import Any, Dict, Optional

from hasfl_ray.analysis.runs import (  # noqa: F401 (re-exported)
    LOCAL_CLIENT_COLUMNS, LOCAL_KEYS, LOCAL_STATISTICS, NOT_RECORDED, NUMERIC_CLIENT_COLUMNS, WIDTHS_EXPECTED, _brief,
    _check_local, _check_summary, _read_config, check_number_map, check_width_map, number, read_clients, read_run,
    run_option, width_of)
from hasfl_ray.analysis.rows import (  # noqa: F401 (re-exported)
    ROW_FREE_KEYS, check_row, row_keys, row_protocol, run_groups, run_label, sweep_name)
from hasfl_ray.analysis.statistics import (  # noqa: F401 (re-exported)
    ALPHA, CONFOUND_KEYS, _client_arrays, _finite, confound_statistics, confound_verdict, correlation_test, mean_std,
    partial_correlation, partial_correlation_test)
from hasfl_ray.analysis.tables.confound import (  # noqa: F401 (re-exported)
    CONFOUND_COLUMNS, analyze_runs, confound_correlations, confound_latex, confound_markdown)
from hasfl_ray.analysis.tables.layout import (  # noqa: F401 (re-exported)
    DATASET_NAMES, DISPLAY_NAMES, _latex_grid, _markdown_grid, _tex, display_name, protocol_line)
from hasfl_ray.analysis.tables.summary import (  # noqa: F401 (re-exported)
    ALGORITHM_TYPES, TABLE_COLUMNS, _coverage_columns, algorithm_type, summarise_runs, table_csv, table_latex,
    table_markdown)
from hasfl_ray.analysis.tables.widths import (  # noqa: F401 (re-exported)
    LOCAL_WIDTHS, NO_CLIENT_SCORED, _cell_text, _local, _stat, _statistic, _undefined_notes, _width_label, _widths,
    grid_csv, grid_latex, grid_markdown, omitted_lines, width_tables)
from hasfl_ray.errors import OutputError
from hasfl_ray.files import atomic_write


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
