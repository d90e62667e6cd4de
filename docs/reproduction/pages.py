"""The generated parts of docs/reproduction/'s prose pages: each page's text between ``<!-- make_report.py: NAME -->``
and ``<!-- end NAME -->`` is make_report.py's section NAME (a table, a line on where its numbers were made), so the
numbers a page shows are those of the committed results; the prose around them is written by hand."""

from __future__ import annotations

import os
import re
from typing import Dict

HERE = os.path.dirname(os.path.abspath(__file__))
#: The pages holding generated sections.
PAGES = ("async-digits.md", "clocked-digits.md", "packs.md")
MARKER = re.compile(r"(<!-- make_report\.py: ([\w-]+) -->\n)(.*?)(<!-- end \2 -->)", re.S)


def fill(sections: Dict[str, str], out_root: str, source: str = HERE) -> None:
    """Each page of ``source`` with its sections replaced, written under ``out_root``; a section the results do
    not hold is left as it is, and a section with no marker on any page is refused (a table nobody shows)."""
    used = set()
    for page in PAGES:
        with open(os.path.join(source, page), encoding="utf-8") as handle:
            text = handle.read()

        def replace(match):
            name = match.group(2)
            if name not in sections:
                return match.group(0)
            used.add(name)
            return match.group(1) + sections[name] + match.group(4)

        with open(os.path.join(out_root, page), "w", encoding="utf-8") as handle:
            handle.write(MARKER.sub(replace, text))
    missing = sorted(set(sections) - used)
    if missing:
        raise SystemExit(f"make_report.py: section {missing[0]!r} has no marker on any of {', '.join(PAGES)}; "
                         "expected '<!-- make_report.py: NAME -->' ... '<!-- end NAME -->' on one page")
