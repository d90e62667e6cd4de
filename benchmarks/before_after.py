"""Run benchmark scripts on two commits, interleaved, in one session: "nothing got slower" measured honestly.

The older commit is checked out with ``git worktree`` into a temporary folder (removed afterwards); its compiled
extension is the current checkout's ``hasfl_ray/_C*.so`` when ``csrc/`` and ``setup.py`` did not change between
the two commits (otherwise it is built there, which takes minutes). Each benchmark then runs alternately from the
two trees (``before`` first in even repeats, ``after`` first in odd ones), with ``PYTHONPATH`` pointing at the tree,
and its output is printed under a heading naming the tree and repeat; the benchmarks themselves print their
figures and ratios.

    python benchmarks/before_after.py --before 6f84930 --repeats 2 \\
        "bench_simulation.py --runs local,ray2 --repeats 1" "bench_aggregate.py --quick"
"""

from __future__ import annotations

import argparse
import glob
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, check=True, capture_output=True, text=True).stdout.strip()


def prepare(before: str, where: str, reuse_extension: bool = False) -> str:
    """A worktree of ``before`` at ``where`` with a usable extension; returns the commit's short hash."""
    git("worktree", "add", "--detach", where, before)
    changed = git("diff", "--name-only", before, "HEAD", "--", "csrc", "setup.py")
    if changed and reuse_extension:
        print(f"csrc/ or setup.py changed since {before} ({changed.replace(chr(10), ', ')}); --reuse-extension: "
              "this checkout's extension is used there anyway", flush=True)
    if not changed or reuse_extension:
        for built in glob.glob(os.path.join(ROOT, "hasfl_ray", "_C*.so")):
            shutil.copy2(built, os.path.join(where, "hasfl_ray"))
    else:
        print(f"csrc/ or setup.py changed since {before} ({changed.split()[0]} ...): building its extension",
              flush=True)
        subprocess.run([sys.executable, "setup.py", "build_ext", "--inplace"], cwd=where, check=True,
                       capture_output=True)
    return git("rev-parse", "--short", before)


def run(tree: str, label: str, command: str) -> float:
    script, *args = shlex.split(command)
    env = dict(os.environ, PYTHONPATH=tree + os.pathsep + os.environ.get("PYTHONPATH", ""))
    begin = time.time()
    path = os.path.join(tree, "benchmarks", script)
    if not os.path.exists(path):  # a script newer than the older commit: this checkout's, on that tree's package
        path = os.path.join(ROOT, "benchmarks", script)
    done = subprocess.run([sys.executable, path, *args], cwd=tree, env=env,
                          capture_output=True, text=True)
    seconds = time.time() - begin
    print(f"\n### {label}: {command} ({seconds:.0f} s, exit {done.returncode})\n", flush=True)
    print(done.stdout.rstrip() or "(no output)")
    if done.returncode:
        print(done.stderr[-3000:])
    return seconds


def problem_of(args) -> str:
    """What keeps the arguments from running, as one sentence naming the value and what was expected, or ''."""
    if args.repeats < 1:
        return f"--repeats is {args.repeats}; expected a positive number of alternating repeats"
    found = subprocess.run(["git", "rev-parse", "--verify", "--quiet", f"{args.before}^{{commit}}"], cwd=ROOT,
                           capture_output=True, text=True)
    if found.returncode:
        return f"--before is {args.before!r}, which names no commit of {ROOT}; expected a git revision"
    for command in args.benchmarks:
        try:
            script = shlex.split(command)[0] if shlex.split(command) else ""
        except ValueError as error:
            return f"the benchmark command {command!r} does not parse ({error}); expected a shell-quoted command line"
        if not script or not os.path.isfile(os.path.join(ROOT, "benchmarks", script)):
            return (f"the benchmark command {command!r} names {script!r}, which is not a script in benchmarks/; "
                    "expected a command line such as 'bench_aggregate.py --quick'")
    return ""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", required=True, help="the older commit (any git revision)")
    parser.add_argument("--repeats", type=int, default=1, help="alternating repeats of every benchmark (default 1)")
    parser.add_argument("--reuse-extension", action="store_true",
                        help="copy this checkout's compiled extension into the older tree even when csrc/ or setup.py "
                             "changed in between (when what changed is what the benchmark never runs: the CUDA "
                             "kernel in a CPU benchmark), instead of building it there (minutes)")
    parser.add_argument("benchmarks", nargs="+", help="benchmark command lines, relative to benchmarks/")
    args = parser.parse_args()
    problem = problem_of(args)  # before any worktree is added or extension built
    if problem:
        parser.error(problem)
    where = tempfile.mkdtemp(prefix="hasfl-before-")
    os.rmdir(where)
    try:
        short = prepare(args.before, where, args.reuse_extension)
        head = git("rev-parse", "--short", "HEAD")
        dirty = " + uncommitted changes" if git("status", "--porcelain", "--untracked-files=no") else ""
        print(f"before = {short} (worktree {where}), after = {head}{dirty} ({ROOT}); "
              f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}", flush=True)
        for command in args.benchmarks:
            for repeat in range(args.repeats):
                trees = [("before", where), ("after", ROOT)]
                for label, tree in trees if repeat % 2 == 0 else trees[::-1]:
                    run(tree, f"{label} {short if label == 'before' else head}, repeat {repeat}", command)
    finally:
        if os.path.exists(where):
            git("worktree", "remove", "--force", where)


if __name__ == "__main__":
    main()
