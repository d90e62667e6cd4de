"""The report's statistics: mean ± std over seeds, (partial) correlations and their tests, Table 5's verdict."""

from __future__ import annotations

import warnings
from typing import Any, Dict, Mapping, Optional, Sequence, Tuple

import numpy as np
from scipy import stats


def mean_std(values: Sequence[float]) -> Tuple[float, float]:
    """Mean and sample standard deviation (0 for one value) over seeds."""
    values = np.asarray(values, dtype=np.float64)
    return float(values.mean()), float(values.std(ddof=1 if len(values) > 1 else 0))


def nan_mean_std(values: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """Per column of ``values`` (seeds x points, NaN where a seed has no value): the mean and the sample standard
    deviation over the seeds that have a value, as :func:`mean_std` gives a table's cell (0 where one seed has one,
    NaN where none has): a figure's band over seeds is the table's ± at the same point."""
    values = np.asarray(values, dtype=np.float64)
    counts = (~np.isnan(values)).sum(axis=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a point no seed has a value at (mean of nothing): NaN
        mean = np.nanmean(values, axis=0)
        std = np.nanstd(values, axis=0, ddof=1)
    return mean, np.where(counts == 1, 0.0, std)


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


def _finite(value: float) -> Optional[float]:
    """``value`` as a float, None for NaN (JSON has no NaN)."""
    return None if value is None or not np.isfinite(value) else float(value)


def paired_comparison(a: Sequence[float], b: Sequence[float], margin: float = 1.0) -> Dict[str, object]:
    """a − b over seeds (percentage points; a[i] and b[i] share seed i, hence partition and tiers): the mean
    difference, its paired 95 % t interval, Welch's t and p, and the paired TOST p for equivalence within ±margin
    (its 90 % interval inside the margin). With 3 seeds the t quantile has 2 degrees of freedom (4.30 for 95 %)."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    d = a - b
    n = len(d)
    out: Dict[str, object] = {"n_seeds": n, "mean_diff": float(d.mean()) if n else None}
    if n < 2:
        return out
    sd = float(d.std(ddof=1))
    se = sd / np.sqrt(n)
    q = float(stats.t.ppf(0.975, n - 1))
    out.update(ci_low=float(d.mean() - q * se), ci_high=float(d.mean() + q * se))
    if a.std() > 0 or b.std() > 0:
        with warnings.catch_warnings():  # near-identical seeds (a tie at the ceiling): the t is still right
            warnings.simplefilter("ignore", RuntimeWarning)
            welch = stats.ttest_ind(a, b, equal_var=False)
        out.update(welch_t=float(welch.statistic), welch_p=float(welch.pvalue))
    if se > 0:
        lower = float(stats.t.sf((d.mean() + margin) / se, n - 1))
        upper = float(stats.t.cdf((d.mean() - margin) / se, n - 1))
        out["tost_p"] = max(lower, upper)
    else:
        out["tost_p"] = 0.0 if abs(d.mean()) < margin else 1.0
    return out
