"""docs/RELIABILITY.md's tables: every row has as many cells as its table's header. A row with one cell more (a root
and a fix given apart) renders without its last cell, the test that holds the row, in GitHub's and MkDocs' tables."""

from __future__ import annotations

import os
from typing import List

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def cells(line: str) -> List[str]:
    """The cells of a Markdown table row: split on ``|`` outside code spans, ``\\|`` kept inside its cell."""
    text = line.rstrip("\n").replace("\\|", "\0")
    found, current, in_code = [], "", False
    for char in text:
        if char == "`":
            in_code = not in_code
        if char == "|" and not in_code:
            found.append(current)
            current = ""
        else:
            current += char
    found.append(current)
    return [cell.replace("\0", "\\|").strip() for cell in found[1:-1]]


def mismatched_rows(text: str) -> List[str]:
    """``line N: k cells, header has h`` for each row whose cell count differs from its table's header."""
    bad, header = [], None
    for number, line in enumerate(text.splitlines(), 1):
        if not line.startswith("|"):
            header = None
            continue
        count = len(cells(line))
        if header is None:
            header = count
        elif count != header:
            bad.append(f"line {number}: {count} cells, header has {header}")
    return bad


def test_a_row_with_a_cell_too_many_is_found():
    table = "| a | b |\n|---|---|\n| x | `p|q` | y |\n| x | `p|q` \\| r |\n"
    assert mismatched_rows(table) == ["line 3: 3 cells, header has 2"]


def test_every_reliability_row_has_its_headers_cells():
    with open(os.path.join(ROOT, "docs", "RELIABILITY.md"), encoding="utf-8") as handle:
        assert mismatched_rows(handle.read()) == []
