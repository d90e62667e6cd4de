"""The flags the pages name outside their fenced blocks exist (tests/packaging/test_doc_commands.py parses the
blocks' command lines): an inline `hasfl-ray ...` span names a command and flags of it, a span that starts with a
flag (`--aggregation-backend reference`) names a flag of some `hasfl-ray` command, and a `python benchmarks/X.py ...`
span or line names flags of that script. What the pages quote from other tools (pip, Ray, the sources' own scripts)
is listed in FOREIGN, each with its owner."""

import pathlib
import re
import shlex

import click

from hasfl_ray.cli.main import main

ROOT = pathlib.Path(__file__).resolve().parents[2]
PAGES = ["README.md"] + sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "docs").rglob("*.md"))
#: Flags of other programs that the pages quote, so a span that starts with one is not a hasfl-ray flag.
FOREIGN = {
    "--strict": "mkdocs build", "--use_fast_math": "nvcc", "--help": "every command",
    "--object-manager-port": "ray start", "--node-manager-port": "ray start", "--min-worker-port": "ray start",
    "--max-worker-port": "ray start",
    "--overlap": "FedRolex's main_resnet.py", "--client_split_ratios": "ScaleFL's source",
    "--horizontal_scale_ratios": "ScaleFL's source (args.py)",
    "--bsz": "FIARSE's source", "--model-size": "FIARSE's source", "--control_name": "HeteroFL's and FedRolex's",
}
#: Found here and fixed where the page is merged (docs/RELIABILITY.md is edited by the integrator only): remove the
#: entry with the fix.
AWAITING_MERGE: set = set()
FENCE = re.compile(r"^\s*```.*?^\s*```", re.S | re.M)
SPAN = re.compile(r"`([^`\n]+)`")
BENCH = re.compile(r"python3? benchmarks/(\w+)\.py\b([^`\n]*)")


def options(command):
    """Every option string of ``command`` and, for a group, of its subcommands."""
    found = set()
    for param in command.params:
        found.update(param.opts + param.secondary_opts)
    if isinstance(command, click.Group):
        for sub in command.commands.values():
            found |= options(sub)
    return found


ALL = options(main) | {"--help", "--version"}


def script_flags(name):
    """The flags a benchmark script's argparse parser declares (read from its source, nothing run); bench_aggregate.py
    is `hasfl-ray bench aggregate`'s."""
    if name == "bench_aggregate":
        return options(main.commands["bench"].commands["aggregate"])
    path = ROOT / "benchmarks" / f"{name}.py"
    return set(re.findall(r"add_argument\(\s*\"(--[\w-]+)\"", path.read_text())) if path.exists() else None


#: A span that starts with a flag names one of `hasfl-ray`'s or of a benchmark script's (the benchmarks page's table).
SCRIPTS = set().union(*(script_flags(p.stem) for p in sorted((ROOT / "benchmarks").glob("*.py"))))


def known(flag, allowed):
    """Whether ``flag`` is in ``allowed``; `--dp-*` stands for every flag it starts."""
    return flag.rstrip("*") in allowed or (flag.endswith("*") and any(a.startswith(flag[:-1]) for a in allowed))


def inline_command(span):
    """The command of an inline `hasfl-ray ...` span and the flags it names: (command path, missing flags), or
    (None, [name]) where a word after `hasfl-ray` names no command."""
    words = shlex.split(span.replace("\\|", "|").split("|")[0].split("#")[0])[1:]
    command, path = main, ["hasfl-ray"]
    while isinstance(command, click.Group) and words and not words[0].startswith("-") and not words[0].isupper():
        if words[0] not in command.commands:
            return None, [words[0]]
        command = command.commands[words[0]]
        path.append(words.pop(0))
    allowed = options(command) | {"--help"}
    return " ".join(path), [w for w in words if w.startswith("--") and not known(w.split("=")[0], allowed)]


def findings(pages=PAGES, read=lambda page: (ROOT / page).read_text(encoding="utf-8")):
    """(page, line, what) for every unknown flag or command named inline, and for every benchmark script flag that
    the script lacks, fenced lines included."""
    found = []
    for page in pages:
        text = read(page)
        for match in BENCH.finditer(text):
            declared = script_flags(match.group(1))
            line = text.count("\n", 0, match.start()) + 1
            if declared is None:
                found.append((page, line, f"benchmarks/{match.group(1)}.py does not exist"))
                continue
            for flag in re.findall(r"(?<![\w-])--[\w-]+\*?", match.group(2)):
                if not known(flag, declared | {"--help"}):
                    found.append((page, line, f"benchmarks/{match.group(1)}.py has no {flag}"))
        prose = FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)
        for match in SPAN.finditer(prose):
            span, line = match.group(1).strip(), prose.count("\n", 0, match.start()) + 1
            if span.startswith("hasfl-ray ") and not span.startswith("hasfl-ray --"):
                path, missing = inline_command(span)
                found += [(page, line, f"`{span}`: {path or 'hasfl-ray'} has no {word}") for word in missing]
            elif re.match(r"--[a-z]", span):
                flag = re.match(r"--[\w-]+\*?", span).group(0)
                if not known(flag, ALL | SCRIPTS) and flag not in FOREIGN and (page, flag) not in AWAITING_MERGE:
                    found.append((page, line, f"`{span}`: no hasfl-ray command has {flag}"))
    return found


def test_every_flag_named_inline_exists():
    assert findings() == []


def test_the_check_sees_each_kind_of_unknown_flag():
    """It catches the forms the pages had (so the test above can fail) and passes their fixes."""
    page = {"p.md": "a `--aggregation reference` b `--aggregation-backend reference`\n"
                    "`hasfl-ray cost --model` and `hasfl-ray bench aggregate --layout index\\|mask`\n"
                    "`hasfl-ray cost --modle x` `hasfl-ray simulat`\n"
                    "`python benchmarks/bench_eval.py --share-test-every 5 --test-every 5`\n"
                    "```bash\npython benchmarks/bench_short_rounds.py --settings hasfl --setting x\n```\n"
                    "`pip install --no-build-isolation -e .` `--dp-*` `--overlap`\n"}
    found = [what for _, _, what in findings(["p.md"], page.__getitem__)]
    assert found == ["benchmarks/bench_eval.py has no --test-every",
                     "benchmarks/bench_short_rounds.py has no --setting",
                     "`--aggregation reference`: no hasfl-ray command has --aggregation",
                     "`hasfl-ray cost --modle x`: hasfl-ray cost has no --modle",
                     "`hasfl-ray simulat`: hasfl-ray has no simulat"]
