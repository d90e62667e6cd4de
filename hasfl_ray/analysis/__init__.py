"""Analysis of finished run directories: the paper's tables (mean ± std over seeds) and confound correlations."""

from hasfl_ray.analysis.report import (analyze_runs, confound_correlations, partial_correlation, read_run,
                                      summarise_runs, write_analysis)

__all__ = ["analyze_runs", "confound_correlations", "partial_correlation", "read_run", "summarise_runs",
           "write_analysis"]
