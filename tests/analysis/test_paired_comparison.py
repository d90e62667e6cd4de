"""The write-up's equivalence test, now a statistic of the report (issue 36 item 3): the paired mean difference, its
95 % t interval, Welch's t test and the paired TOST p for equivalence within ±margin, against scipy's own tests."""

import numpy as np
import pytest
from scipy import stats

from hasfl_ray.analysis.statistics import paired_comparison


def test_paired_comparison_matches_scipys_tests():
    a, b = np.array([91.2, 90.4, 92.0]), np.array([90.1, 90.6, 91.1])
    out = paired_comparison(a, b, margin=1.0)
    d = a - b
    interval = stats.t.interval(0.95, len(d) - 1, loc=d.mean(), scale=stats.sem(d))
    assert out["mean_diff"] == pytest.approx(d.mean())
    assert (out["ci_low"], out["ci_high"]) == pytest.approx(interval)
    welch = stats.ttest_ind(a, b, equal_var=False)
    assert (out["welch_t"], out["welch_p"]) == pytest.approx((welch.statistic, welch.pvalue))
    lower = stats.ttest_1samp(d, -1.0, alternative="greater").pvalue  # TOST: two one-sided tests against the margin
    upper = stats.ttest_1samp(d, 1.0, alternative="less").pvalue
    assert out["tost_p"] == pytest.approx(max(lower, upper))
    assert paired_comparison([1.0], [0.5]) == {"n_seeds": 1, "mean_diff": 0.5}
