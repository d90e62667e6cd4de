"""Every number of the reproduction write-ups (docs/reproduction/packs.md and async-digits.md) comes from a committed
file: the CSVs make_report.py writes from results/, the configs the pages run, or published-numbers.csv (the other
papers' numbers, each with the repository and path it is copied from). A number typed from memory, a wall time
nobody recorded or a statistic nobody committed fails here with the page, the line and the number.

The generated sections of the pages (between ``<!-- make_report.py: NAME -->`` markers) are not checked here but
count as a source for the prose: the rebuild test holds them byte for byte to make_report.py's output."""

import csv
import math
import pathlib
import re
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
FOLDER = ROOT / "docs" / "reproduction"
#: Page -> the committed files its numbers may come from (glob patterns under the repository).
SOURCES = {
    "packs.md": ["docs/reproduction/packs-*.csv", "docs/reproduction/results/packs-*.csv",
                 "configs/pack-*.yaml", "docs/reproduction/published-numbers.csv"],
    "async-digits.md": ["docs/reproduction/async-digits*.csv", "configs/digits-async*.yaml",
                        "configs/devices/sample-trace.csv"],
}
#: Numbers that count nothing: small counts and ordinals (seeds 3, slide 9, two logits...).
SMALL = 12
NUMBER = re.compile(r"(?<![\w.])(\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?)(?=x\b|[^\w]|$)")
#: Text that holds digits but no claim: generated sections, code, link targets and comments (these four may span
#: lines), dates, issue numbers, and names of models, partitions, widths and exponents.
NOT_CLAIMS = [re.compile(p, re.S) for p in (r"<!-- make_report\.py: ([\w-]+) -->.*?<!-- end \1 -->", r"```.*?```",
                                           r"\]\([^)]*\)", r"<!--.*?-->")] + [re.compile(p) for p in (
    r"`[^`\n]*`", r"\d{4}-\d{2}-\d{2}", r"(?i)issue \d+( items? \d+( and \d+)?)?", r"(?i)\bitems? \d+",
    r"\(\d(?:, ?\d){3}\)", r"[A-Za-z]+-\d+(?:\.\d+)?", r"\b[a-e]\d+\b", r"\d+(?:\.\d+)?\^[−-]?\d+(?:\.\d+)?",
    r"\d/\d+", r"\d+(?:\.\d+)?e[−-]?\d+")]


def claims(page):
    """(line, number) of every number of a page outside its generated sections, code and names."""
    text = (FOLDER / page).read_text(encoding="utf-8")
    for pattern in NOT_CLAIMS:  # blanked, keeping the line numbers
        text = pattern.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), text)
    for index, line in enumerate(text.splitlines(), 1):
        for match in NUMBER.finditer(line):
            token = match.group(1).replace(",", "")
            if "." not in token and int(token) <= SMALL:
                continue
            yield index, match.group(1)


def renderings(value):
    """How a committed number can be written on a page: at 1-4 decimals (whole numbers also at none), as it is,
    as a percentage, in millions or in billions, with and without thousands separators."""
    if not math.isfinite(value):  # digits of a hash read as an exponent
        return set()
    out = set()
    for scaled in (value, 100 * value, value / 1e6, value / 1e9):
        if abs(scaled - round(scaled)) < 1e-9:  # whole numbers (counts, 90 % of 0.9) also without decimals
            out |= {f"{abs(scaled):.0f}", f"{abs(scaled):,.0f}"}
        for decimals in range(1, 5):
            out |= {f"{abs(scaled):.{decimals}f}", f"{abs(scaled):,.{decimals}f}"}
    return out


def committed_numbers(page):
    """Every rendering of every number of the page's committed files (a CSV's cells, a config's text), and the
    numbers of its own generated sections (the rebuild test holds those to make_report.py's output)."""
    generated = "".join(m.group(0) for m in NOT_CLAIMS[0].finditer((FOLDER / page).read_text(encoding="utf-8")))
    found = set(NUMBER.findall(generated))
    for pattern in SOURCES[page]:
        for path in sorted(ROOT.glob(pattern)):
            if path.suffix != ".csv":
                text = path.read_text(encoding="utf-8").replace(",", "")
                for number in re.findall(r"(?<![\w.])\d+(?:\.\d+)?(?:e-?\d+)?", text):
                    found |= renderings(float(number))
                continue
            with open(path, encoding="utf-8", newline="") as handle:
                for row in csv.reader(handle):
                    if path.name == "published-numbers.csv":
                        found.add(row[0])
                    for cell in row:
                        if re.fullmatch(r"[0-9a-f]{16,}", cell):  # a params_sha256
                            continue
                        for part in re.findall(r"\d+(?:\.\d+)?(?:e[+-]?\d+)?", cell.replace(",", "")):
                            try:
                                found |= renderings(float(part))
                            except ValueError:
                                pass
    return found


@pytest.mark.parametrize("page", sorted(SOURCES))
def test_every_number_of_the_page_is_in_a_committed_file(page):
    found = committed_numbers(page)
    missing = [f"{page}:{line}: {number}" for line, number in claims(page) if number not in found
               and number.replace(",", "") not in found]
    assert missing == []


def test_the_check_fails_on_a_number_no_file_holds(tmp_path, monkeypatch):
    """A page with an invented figure is caught, and a committed one passes (so the test can fail)."""
    page = "async-digits.md"
    text = (FOLDER / page).read_text(encoding="utf-8")
    monkeypatch.setattr(sys.modules[__name__], "FOLDER", tmp_path)
    (tmp_path / page).write_text(text + "\nThe runs moved 4,321.9 MB in 13.37 s; T = 12.12 s, 1,250 updates.\n",
                                 encoding="utf-8")
    found = committed_numbers(page)
    added = [number for line, number in claims(page) if line > text.count("\n")]
    assert added == ["4,321.9", "13.37", "12.12", "1,250"]
    assert [n for n in added if n not in found and n.replace(",", "") not in found] == ["4,321.9", "13.37"]


def test_every_published_number_names_a_repository_and_a_path():
    with open(FOLDER / "published-numbers.csv", encoding="utf-8", newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert rows and all(re.fullmatch(r"[\d,.]+", r["number"]) for r in rows)
    for row in rows:  # "owner/repository: path" or a file of this repository
        assert re.match(r"[\w.-]+/[\w.-]+: \S", row["source"]) or (ROOT / row["source"].split(":")[0]).exists() \
            or row["source"].startswith("CIFAR-10"), row
