"""`make test`'s command is the one the pages show (README.md, docs/index.md, docs/install.md: "runs the test suite
...: python -m pytest ..."), and the plugin behind its workers (-n, pytest-xdist) comes with both installs:
requirements-dev.txt (make install, CI) and setup.py's `test` extra (pip install -e ".[test]")."""

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[2]
PAGES = ["README.md", "docs/index.md", "docs/install.md"]


def make_test_command():
    """The Makefile's `test` recipe with each variable's default put in (`$(PY)` as `python`)."""
    text = (ROOT / "Makefile").read_text(encoding="utf-8")
    recipe = re.search(r"^test:.*\n\t(.+)$", text, re.M).group(1)
    defaults = dict(re.findall(r"^(?:export\s+)?(\w+)\s*\?=\s*(\S+)", text, re.M), PY="python")
    return re.sub(r"\$\((\w+)\)", lambda match: defaults[match.group(1)], recipe)


def test_each_page_shows_the_makefiles_test_command():
    command = make_test_command()
    for page in PAGES:
        shown = re.findall(r"^make test\s+#[^:]*: (python -m pytest .+)$", (ROOT / page).read_text(encoding="utf-8"),
                           re.M)
        assert shown == [command], (page, shown, command)


def test_the_workers_plugin_comes_with_make_install_and_with_the_test_extra():
    assert " -n " in make_test_command()
    requirements = (ROOT / "requirements-dev.txt").read_text(encoding="utf-8")
    assert re.search(r"^pytest-xdist>=", requirements, re.M), requirements
    extra = re.search(r'"test": \[([^\]]*)\]', (ROOT / "setup.py").read_text(encoding="utf-8")).group(1)
    assert '"pytest-xdist>=' in extra, extra
