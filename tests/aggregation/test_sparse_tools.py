"""The sparse kernel's tools at tiny sizes and with bad values (h67): `hasfl-ray bench aggregate --layout depth`
without --models, and benchmarks/census_sparse.py, profile_kernel.py, sparse_one_thread.py and before_after.py
given values they cannot run: one sentence naming the value and what was expected, exit 2, never a traceback (and
never a worktree added or an extension built first)."""

import json
import os
import re
import subprocess
import sys

import pytest
import torch
from click.testing import CliRunner

from hasfl_ray.cli.main import main

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_bench_aggregate_depth_layout_without_models_runs_the_default_models_that_have_depths():
    """`hasfl-ray bench aggregate --layout depth` (docs/kernel.md lists the layout) was refused whenever --models
    was left out: the default list holds the Shakespeare LSTM, which has no exits. Without --models the depth cases
    are those of the default models that have depths; a model named is still held to it
    (test_cli.py::test_bench_aggregate_depth_layout_of_a_model_without_exits_exits_2)."""
    result = CliRunner().invoke(main, ["bench", "aggregate", "--layout", "depth,index", "--clients", "2",
                                       "--repeats", "1", "--skip-slow", "--json"])
    assert result.exit_code == 0, result.output
    cases = json.loads(result.output.splitlines()[-1])
    assert [(case["layout"], case["model"]) for case in cases] == [
        ("depth", "emnist"), ("depth", "cifar10"), ("index", "emnist"), ("index", "cifar10"),
        ("index", "shakespeare")]


def _run(script, *args):
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", script), *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)


def _assert_one_sentence(done, sentence):
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert done.stderr.strip().splitlines()[-1] == sentence


@pytest.mark.parametrize("args, sentence", [
    (["--clients", "0"], "census_sparse.py: error: --clients is 0; expected a positive number of clients"),
    (["--clients", "-2"], "census_sparse.py: error: --clients is -2; expected a positive number of clients"),
    (["--model", "bogus", "--clients", "2"],
     "census_sparse.py: error: --model is 'bogus'; expected one of emnist, cifar10, shakespeare"),
    (["--seed", "-1", "--clients", "2"], "census_sparse.py: error: --seed is -1; expected a seed >= 0"),
])
def test_census_sparse_bad_values_are_one_sentence(args, sentence):
    """--clients 0 was numpy's "cannot unpack non-iterable numpy.float64 object", -2 "negative dimensions are not
    allowed", an unknown model build_model's ValueError: each a traceback, exit 1."""
    _assert_one_sentence(_run("census_sparse.py", *args), sentence)


def test_census_sparse_more_clients_than_memory_holds_is_refused_before_any_is_made():
    done = _run("census_sparse.py", "--clients", "100000000")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines()[-1].startswith("census_sparse.py: error: clients is 100000000, which needs")


def test_census_sparse_tiny_run():
    done = _run("census_sparse.py", "--model", "shakespeare", "--clients", "1")
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith("shakespeare, 1 clients, masks at the tier mix:")


CASES = "expected one of emnist, cifar10, shakespeare, a colon and a positive number of clients, e.g. emnist:50"


@pytest.mark.parametrize("args, sentence", [
    (["--device", "cpu", "--cases", "emnist"], f"--cases entry 'emnist' is not MODEL:CLIENTS; {CASES}"),
    (["--device", "cpu", "--cases", "emnist:0"], f"--cases entry 'emnist:0' is not MODEL:CLIENTS; {CASES}"),
    (["--device", "cpu", "--cases", "emnist:x"], f"--cases entry 'emnist:x' is not MODEL:CLIENTS; {CASES}"),
    (["--device", "cpu", "--cases", "bogus:2"], f"--cases entry 'bogus:2' is not MODEL:CLIENTS; {CASES}"),
    (["--device", "cpu", "--cases", "emnist:2", "--repeats", "0"],
     "--repeats is 0; expected a positive number of timed calls"),
    (["--device", "tpu"], "argument --device: invalid choice: 'tpu' (choose from 'cuda', 'cpu')"),
])
def test_profile_kernel_bad_values_are_one_sentence(args, sentence):
    """Each was a traceback (ValueError from unpacking, int(), build_model or validate_inputs, StatisticsError,
    torch's device string), exit 1."""
    _assert_one_sentence(_run("profile_kernel.py", *args), f"profile_kernel.py: error: {sentence}")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the sentence shown without a GPU")
def test_profile_kernel_without_a_gpu_says_what_is_missing():
    """It said "needs the extension (and for --device cuda a CUDA device and its CUDA kernel ...)" on stdout, where
    the extension was built: the sentence now names what is missing."""
    done = _run("profile_kernel.py")
    _assert_one_sentence(done, "profile_kernel.py: --device cuda needs a visible CUDA GPU, but "
                               "torch.cuda.is_available() is False; expected a GPU machine (--device cpu rehearses "
                               "the checks)")
    assert done.stdout == ""


def test_profile_kernel_rehearsal_on_the_cpu():
    done = _run("profile_kernel.py", "--device", "cpu", "--cases", "emnist:2", "--repeats", "1", "--no-profiler")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "emnist x2:" in done.stdout and "all written: True" in done.stdout


USAGE = " (usage: sparse_one_thread.py index|mask REPEATS [CLIENTS])"


@pytest.mark.parametrize("args, sentence", [
    ([], "sparse_one_thread.py takes 2 or 3 arguments, got 0 (none); expected a layout, a positive number of "
         "repeats and optionally of clients (default 50)"),
    (["bogus", "1"], "the layout is 'bogus'; expected index or mask"),
    (["mask", "0"], "REPEATS is '0'; expected a positive whole number"),
    (["mask", "1", "x"], "CLIENTS is 'x'; expected a positive whole number"),
])
def test_sparse_one_thread_bad_values_name_the_value(args, sentence):
    """The usage line did not say which argument was wrong, nor its value."""
    _assert_one_sentence(_run("sparse_one_thread.py", *args), sentence + USAGE)


@pytest.mark.parametrize("layout", ["index", "mask"])
def test_sparse_one_thread_times_the_kernel_and_the_whole_call(layout):
    done = _run("sparse_one_thread.py", layout, "1", "3")
    assert done.returncode == 0, done.stderr[-2000:]
    match = re.fullmatch(rf"{layout}: ([0-9.]+) ms \(median of 1, process CPU time, \d+ thread\(s\)\); end to end "
                         r"([0-9.]+) ms, ([0-9.]+)x the kernel alone \(.*\)", done.stdout.strip())
    assert match, done.stdout
    kernel, whole, ratio = map(float, match.groups())
    assert kernel > 0 and whole > 0 and abs(ratio - whole / kernel) < 0.01 * ratio + 0.01


def test_sparse_one_thread_more_clients_than_memory_holds_is_refused_before_any_is_made():
    done = _run("sparse_one_thread.py", "mask", "1", "100000000")
    assert done.returncode == 2 and done.stderr.strip().startswith("clients is 100000000, which needs")


@pytest.mark.parametrize("args, sentence", [
    (["--before", "no-such-revision", "bench_aggregate.py"],
     f"--before is 'no-such-revision', which names no commit of {ROOT}; expected a git revision"),
    (["--before", "HEAD", "--repeats", "0", "bench_aggregate.py"],
     "--repeats is 0; expected a positive number of alternating repeats"),
    (["--before", "HEAD", "no_such_bench.py --quick"],
     "the benchmark command 'no_such_bench.py --quick' names 'no_such_bench.py', which is not a script in "
     "benchmarks/; expected a command line such as 'bench_aggregate.py --quick'"),
])
def test_before_after_bad_values_are_one_sentence_before_any_worktree(args, sentence):
    """A revision git does not know was git's CalledProcessError traceback; --repeats 0 or a script that does not
    exist added the older commit's worktree (and built its extension, minutes) before running nothing or failing."""
    if not os.path.isdir(os.path.join(ROOT, ".git")) and not os.path.isfile(os.path.join(ROOT, ".git")):
        pytest.skip("needs a git checkout (before_after.py compares commits)")
    done = _run("before_after.py", *args)
    _assert_one_sentence(done, f"before_after.py: error: {sentence}")
    assert "before =" not in done.stdout
