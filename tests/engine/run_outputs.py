"""What the DP run tests read of a run directory, and how they start one (shared by test_privacy_runs.py,
test_poisson_participation.py and tests/aggregation/test_private_fused_sparse.py; needs nothing of the privacy
extra, so a module that does not account ε imports it without dp-accounting)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import List, Sequence

from tests.cli.sentences import invoke


def lines(out: Path) -> List[dict]:
    """metrics.jsonl, one dict a line."""
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def summary(out: Path) -> dict:
    return json.loads((out / "summary.json").read_text())


def run_into(base: Sequence[str], tmp_path: Path, name: str, *extra) -> Path:
    """``hasfl-ray`` with ``base`` then ``extra`` into tmp_path / name, which it returns; asserts exit status 0."""
    out = tmp_path / name
    result = invoke(*base, *extra, "--out", out)
    assert result.exit_code == 0, result.output
    return out


def assert_resume_and_ray_equal(run: Sequence[str], tmp_path: Path, local: Path, start_ray=None) -> None:
    """The same run stopped by a fault at round 2 and resumed, and on Ray with one actor, end with ``local``'s
    params_sha256 (the Ray half skips, saying why, where Ray is not installed). ``start_ray``: the ``ray_shared``
    fixture, to run the Ray half on the Ray the test session keeps (else the run starts and stops its own)."""
    import pytest

    crashed = tmp_path / "crashed"
    result = invoke(*run, "--backend", "local", "--fault-inject", "trainer-error@2", "--out", crashed)
    assert result.exit_code == 1, result.output
    resumed = invoke("simulate", "--out", crashed, "--resume", "--quiet")
    assert resumed.exit_code == 0, resumed.output
    assert summary(crashed)["params_sha256"] == summary(local)["params_sha256"]
    pytest.importorskip("ray", reason="needs Ray")
    if start_ray is not None:
        start_ray()
    ray = run_into(run, tmp_path, "ray", "--backend", "ray", "--actors", "1")
    assert summary(ray)["params_sha256"] == summary(local)["params_sha256"]
