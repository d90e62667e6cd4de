"""Analysis of finished run directories: the paper's tables (mean ± std over seeds) and confound correlations."""

from hasfl_ray.analysis.report import confound_correlations, partial_correlation, read_run, summarise_runs

__all__ = ["confound_correlations", "partial_correlation", "read_run", "summarise_runs"]
