"""The benchmark headlines are one table: docs/benchmarks.md's "Headlines" is README.md's "Benchmark headlines" row
for row (links aside), so a figure updated on one page cannot stay stale on the other; and every script in
benchmarks/ is named in the page's table of scripts."""

import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[2]


def table_after(text, heading):
    """The rows of the first markdown table after the line ``heading``."""
    lines = text.splitlines()
    start = lines.index(heading)
    first = next(k for k in range(start, len(lines)) if lines[k].startswith("|"))
    end = next((k for k in range(first, len(lines)) if not lines[k].startswith("|")), len(lines))
    return lines[first:end]


def headlines(page, heading, links):
    """The headline table of ``page``, its links made relative to the repository root (README's are, docs/'s are
    relative to docs/)."""
    rows = table_after((ROOT / page).read_text(encoding="utf-8"), heading)
    return [row.replace("](", "](docs/") if links else row for row in rows]


def test_the_benchmarks_page_headlines_are_the_readmes():
    readme = headlines("README.md", "## Benchmark headlines", links=False)
    page = headlines("docs/benchmarks.md", "## Headlines", links=True)
    assert len(readme) > 10
    assert page == readme


def test_every_benchmark_script_is_on_the_benchmarks_page():
    scripts = table_after((ROOT / "docs/benchmarks.md").read_text(encoding="utf-8"), "## The scripts")
    text = "\n".join(scripts)
    missing = [path.name for path in sorted((ROOT / "benchmarks").iterdir())
               if path.suffix in (".py", ".sh") and f"`benchmarks/{path.name}" not in text]
    assert len(scripts) > 10 and missing == []


def test_the_comparison_sees_a_stale_row():
    """A row changed on one page only is a difference (so the first test can fail)."""
    rows = table_after("## H\n\n| a | b |\n|---|---|\n| x | 1 % |\ntext\n", "## H")
    assert rows == ["| a | b |", "|---|---|", "| x | 1 % |"]
    assert rows != table_after("## H\n| a | b |\n|---|---|\n| x | 2 % |\n", "## H")
