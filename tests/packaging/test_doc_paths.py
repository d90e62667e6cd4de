"""Every repository file the pages name exists: a path under hasfl_ray/, csrc/, tests/, benchmarks/, configs/ or
examples/ (a glob matches something, `{a,b}` each of its forms), and a `tests/...py::name` or `hasfl_ray/...py::name`
is defined in that file, so a page cannot keep pointing at a moved module, a renamed test or a deleted config."""

import itertools
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[2]
PAGES = ["README.md"] + sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "docs").rglob("*.md"))
PATH = re.compile(r"(?<![\w./-])((?:hasfl_ray|csrc|tests|benchmarks|configs|examples)/[\w./*{},-]*\w)(?:::([\w.]+))?")
#: The layout page's pattern for where a module's tests live, not a file.
PLACEHOLDERS = {"hasfl_ray/x/y.py", "tests/x/test_y.py"}


def forms(path):
    """``path`` with each `{a,b}` expanded."""
    parts = re.split(r"\{([^}]*)\}", path)
    choices = [[part] if k % 2 == 0 else part.split(",") for k, part in enumerate(parts)]
    return ["".join(choice) for choice in itertools.product(*choices)]


def missing(pages=PAGES, read=lambda page: (ROOT / page).read_text(encoding="utf-8"), root=ROOT):
    """(page, line, what) for every named path that does not exist and every named definition its file lacks."""
    found = []
    for page in pages:
        for number, line in enumerate(read(page).splitlines(), 1):
            for match in PATH.finditer(line):
                path, name = match.group(1).rstrip("."), match.group(2)
                if path in PLACEHOLDERS:
                    continue
                for form in forms(path):
                    hits = list(root.glob(form)) if "*" in form else [root / form] if (root / form).exists() else []
                    if not hits:
                        found.append((page, number, f"{form} does not exist"))
                    elif name and form.endswith(".py"):
                        last = name.split(".")[-1]
                        if not re.search(rf"^\s*(?:async\s+)?(?:def|class)\s+{last}\b|^{last}\b",
                                         hits[0].read_text(encoding="utf-8"), re.M):
                            found.append((page, number, f"{form} defines no {last}"))
    return found


def test_every_repository_path_the_pages_name_exists():
    assert missing() == []


def test_the_check_sees_a_missing_file_and_a_missing_test(tmp_path):
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_a.py").write_text("def test_here():\n    pass\n")
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "paper-a.yaml").write_text("")
    page = ("`tests/test_a.py::test_here`, `tests/test_a.py::test_gone`, `tests/test_b.py`,\n"
            "`configs/paper-{a,b}.yaml`, `configs/paper-*.yaml`, `configs/pack-*.yaml`.")
    found = [what for _, _, what in missing(["p.md"], lambda _: page, tmp_path)]
    assert found == ["tests/test_a.py defines no test_gone", "tests/test_b.py does not exist",
                     "configs/paper-b.yaml does not exist", "configs/pack-*.yaml does not exist"]
