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
