"""No page a user reads points at ../shared/: that folder sits beside the developers' checkout (reviews, data
samples, the anchors file) and a user's clone has none, so a page names the source files themselves (repository and
path) and a data folder as DATA, a placeholder it explains."""

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[2]
#: What a user reads: the README, docs/ (pages and the reproduction scripts), the configs' comments, examples/ and
#: the benchmarks' docstrings and scripts. benchmarks/RESULTS.md is left out: it is the log of runs as they were
#: made (their commands name the folders they read), not a page that tells a user where anything is.
PATTERNS = ("README.md", "docs/**/*.md", "docs/**/*.py", "docs/**/*.sh", "configs/**/*.yaml", "examples/**/*",
            "benchmarks/*.py", "benchmarks/*.sh", "benchmarks/*.md")
LEFT_OUT = {"benchmarks/RESULTS.md"}
SHARED = re.compile(r"\.\./shared|(?<![\w-])shared/(?:data|anchors|reviews|paper|tools|PAPER|DESIGN|STYLE)")


def user_pages():
    for pattern in PATTERNS:
        for path in sorted(ROOT.glob(pattern)):
            relative = path.relative_to(ROOT).as_posix()
            if path.is_file() and relative not in LEFT_OUT:
                yield relative, path


def test_no_user_page_points_at_the_shared_folder():
    found = [f"{name}:{index}: {line.strip()[:100]}" for name, path in user_pages()
             for index, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1)
             if SHARED.search(line)]
    assert found == []


def test_the_check_sees_each_form(tmp_path):
    """The pattern catches the forms the pages used (so the test above can fail) and not the word alone."""
    caught = [line for line in ("--data-dir ../shared/data/torchvision", "`../shared/anchors/sub-model-sources.md`",
                                "DATA=${1:-../shared/data}", "copied from shared/anchors/x.md",
                                "a shared/ memory region", "shared-memory transport") if SHARED.search(line)]
    assert caught == ["--data-dir ../shared/data/torchvision", "`../shared/anchors/sub-model-sources.md`",
                      "DATA=${1:-../shared/data}", "copied from shared/anchors/x.md"]
    assert {name for name, _ in user_pages()} >= {"README.md", "docs/reproduction/packs.md",
                                                  "configs/pack-heterofl-cifar10.yaml", "benchmarks/gpu_check.sh"}
