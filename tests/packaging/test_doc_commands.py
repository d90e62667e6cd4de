"""Every `hasfl-ray ...` command line of README.md and docs/*.md (issue 45 item 1): each parses with the commands'
own click parser (its command and flags exist, its values have their types), every `sweep` line plans its cells
(its config's variants and the flags beside them are accepted, as the command checks them before running a cell),
and the quick ones run as written, one after another in document order in one fresh folder, as a reader following
the docs would run them. Beyond the fenced blocks (tests/packaging/test_doc_flags.py): the flags named inline.

Which commands run: those in a fenced block that the doc marks, on the line before its fence, with an HTML comment
(invisible on the rendered page)::

    <!-- doc-test: quick --rounds 2 --clients 10 --clients-per-round 5 -->

The flags after ``quick`` are how the doc shortens the block's ``simulate`` and ``sweep`` commands (appended, so they
win over the line's own); every other command of the block runs exactly as written. A command of a marked block that
needs what the test's fresh folder cannot have runs nowhere but is still parsed: data from outside the repository
(``--data-dir``, a dataset read from files), a GPU or a Ray cluster (``--device cuda``, ``--gpus-per-actor``,
``--address``), or minutes of timing (``bench``)."""

import os
import pathlib
import re
import shlex
import shutil

import click
import pytest
from click.testing import CliRunner

from hasfl_ray.cli.main import main

ROOT = pathlib.Path(__file__).resolve().parents[2]
PAGES = ["README.md"] + sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "docs").rglob("*.md"))
MARKER = re.compile(r"<!--\s*doc-test:\s*quick\b(.*?)-->")
#: What a command needs that the test's folder cannot give: data read from files, a GPU, a cluster, minutes.
FILE_DATASETS = ("emnist", "cifar10", "cifar100", "shakespeare")
ELSEWHERE = ("--data-dir", "--device", "--gpus-per-actor", "--address")
#: What the repository gives a command run in the fresh folder (relative paths in the docs name these).
CARRIED = ("configs", "examples")


def doc_commands():
    """(page, line, argument list, the page's shortening flags or None) of every `hasfl-ray` line in a fenced
    block, in document order; a line ending in a backslash continues on the next."""
    found = []
    for page in PAGES:
        lines = (ROOT / page).read_text(encoding="utf-8").splitlines()
        fence, quick, index = False, None, 0
        while index < len(lines):
            line = lines[index]
            if line.strip().startswith("```"):
                if not fence:
                    before = next((lines[k] for k in range(index - 1, -1, -1) if lines[k].strip()), "")
                    marked = MARKER.search(before)
                    quick = shlex.split(marked.group(1)) if marked else None
                fence = not fence
            elif fence and re.match(r"\s*(\$ )?hasfl-ray(\s|$)", line):
                start, text = index + 1, line
                while text.rstrip().endswith("\\") and index + 1 < len(lines):
                    index += 1
                    text = text.rstrip()[:-1] + " " + lines[index].strip()
                found.append((page, start, words(text), quick))
            index += 1
    return found


def words(text):
    """The arguments of one shell line after `hasfl-ray`: comments dropped, cut at a pipe, a redirection or a second
    command."""
    lexer = shlex.shlex(text.strip().removeprefix("$ "), posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    tokens = []
    for token in lexer:
        if token and set(token) <= set("|&;<>()"):
            break
        tokens.append(token)
    assert tokens[0] == "hasfl-ray", text
    return tokens[1:]


def parse(args):
    """Parse ``args`` as `hasfl-ray` would, down to the command, without running it: click's own errors (a flag or
    command that does not exist, a value of the wrong type) raise click.UsageError."""
    command, context, rest, name = main, None, list(args), "hasfl-ray"
    while True:
        try:
            context = command.make_context(name, rest, parent=context)
        except click.exceptions.Exit:  # --help, --version: answered before any command
            return
        if not isinstance(command, click.Group):
            return
        rest = list(getattr(context, "_protected_args", None) or context.protected_args) + list(context.args)
        if not rest:
            return
        name, command, rest = command.resolve_command(context, rest)


def runs_here(args):
    """Whether the test's folder has what ``args`` needs (see the module docstring)."""
    if args[:1] == ["bench"] or any(word.split("=")[0] in ELSEWHERE for word in args):
        return False
    if args[:1] in (["simulate"], ["sweep"], ["data"]):
        datasets = [args[k + 1] for k, word in enumerate(args[:-1]) if word in ("--dataset", "--datasets")]
        return not any(name in FILE_DATASETS for value in datasets for name in value.split(","))
    return True


COMMANDS = doc_commands()


def test_the_docs_have_commands_and_marked_blocks():
    """The extraction sees the pages' commands (so the tests below can fail) and some of them are marked quick."""
    assert len(COMMANDS) > 60 and {page for page, *_ in COMMANDS} >= {"README.md", "docs/usage.md"}
    assert sum(quick is not None for *_, quick in COMMANDS) >= 20
    assert words("hasfl-ray report runs/ --out t   # a comment | not a pipe") == ["report", "runs/", "--out", "t"]
    assert words("hasfl-ray info --json | jq .torch") == ["info", "--json"]
    with pytest.raises(click.UsageError):
        parse(["simulate", "--num-rounds", "5"])
    with pytest.raises(click.UsageError):
        parse(["data", "inspect", "--clients", "many"])


@pytest.mark.parametrize("page, line, args", [(p, n, a) for p, n, a, _ in COMMANDS],
                         ids=[f"{p}:{n}" for p, n, *_ in COMMANDS])
def test_every_doc_command_parses(page, line, args):
    parse(args)


def test_the_quick_doc_commands_run_as_written_one_after_another(tmp_path, monkeypatch):
    """The marked blocks' commands in document order in one fresh folder (with the repository's configs/ and
    examples/ beside them, as in a checkout): none refused because an earlier one wrote its folder, none failing."""
    for name in CARRIED:
        shutil.copytree(ROOT / name, tmp_path / name)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    ran, failed = [], []
    for page, line, args, quick in COMMANDS:
        if quick is None or not runs_here(args):
            continue
        full = args + (quick if args[:1] in (["simulate"], ["sweep"]) else [])
        result = CliRunner().invoke(main, full + (["--quiet"] if args[:1] == ["simulate"] else []))
        ran.append(f"{page}:{line}")
        if result.exit_code != 0:
            failed.append(f"{page}:{line} `hasfl-ray {shlex.join(full)}` exit {result.exit_code}: "
                          f"{result.output.strip()[-300:]}")
    assert failed == [] and len(ran) >= 20, (ran, failed)
    assert os.path.islink("runs/latest")


class Planned(Exception):
    """Raised where `sweep` would start running its planned cells (see the test below)."""


def test_every_doc_sweep_plans_its_cells(tmp_path, monkeypatch):
    """Each `hasfl-ray sweep` line of the docs, as written, gets as far as its cells' executor: the config's variants
    it names exist and every cell's config is valid with the line's flags (e.g. --local-steps refused beside a
    config's local_epochs), which parsing alone cannot see. Nothing runs or is written: the executor stops it."""
    import hasfl_ray.cli.sweep as sweep_command

    for name in CARRIED:
        shutil.copytree(ROOT / name, tmp_path / name)
    monkeypatch.chdir(tmp_path)

    def stop(*args, **kwargs):
        raise Planned()

    monkeypatch.setattr(sweep_command, "_executor", stop)
    planned, refused = [], []
    for page, line, args, _ in COMMANDS:
        if args[:1] != ["sweep"]:
            continue
        result = CliRunner().invoke(main, args)
        planned.append(f"{page}:{line}")
        if not isinstance(result.exception, Planned):
            refused.append(f"{page}:{line} `hasfl-ray {shlex.join(args)}` exit {result.exit_code}: "
                           f"{result.output.strip()[-300:]}")
    assert refused == [] and len(planned) >= 10, (planned, refused)
    assert not (tmp_path / "runs").exists()


def test_the_sweep_check_sees_a_variant_that_is_gone(tmp_path, monkeypatch):
    """The check above fails on the forms the league page had (so it can fail): an old variant name, and
    --local-steps beside the config's local_epochs."""
    import hasfl_ray.cli.sweep as sweep_command

    shutil.copytree(ROOT / "configs", tmp_path / "configs")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sweep_command, "_executor", lambda *a, **k: (_ for _ in ()).throw(Planned()))
    base = ["sweep", "configs/league-cifar10.yaml", "--data-dir", "DATA", "--seeds", "42", "--algorithms"]
    gone = CliRunner().invoke(main, base + ["fiarse-dir0.3-l4"])
    both = CliRunner().invoke(main, base + ["fiarse-dir0.3-l4-10.20.30.40", "--local-steps", "2"])
    fine = CliRunner().invoke(main, base + ["fiarse-dir0.3-l4-10.20.30.40", "--local-epochs", "1"])
    assert gone.exit_code == 2 and "did you mean 'fiarse-dir0.3-l4-10.20.30.40'" in gone.output
    assert both.exit_code == 2 and "local_steps" in both.output
    assert isinstance(fine.exception, Planned)
