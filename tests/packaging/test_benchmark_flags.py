"""The benchmark scripts' bad flags (benchmarks/arguments.py): one sentence on stderr naming the flag, the value and
what was expected, exit status 2, before anything runs or a scratch folder is made. Before: ``soak.py --every 0``
a ZeroDivisionError after its first round, ``--rounds 20`` an IndexError after the whole run (the default warm-up
is 50 rounds), ``--local-steps 0`` dropped silently, a bad dataset a traceback after its folder was made;
``bench_short_rounds.py --settings x`` a KeyError; ``bench_async.py --buffer`` above ``--concurrency`` a
CalledProcessError from its first point. Also: bench_eval.py's digits section wrapped ``Engine.evaluation_metrics``,
gone since evaluation is deferred, so its default command ended in an AttributeError."""

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BENCH = os.path.join(ROOT, "benchmarks")


def refused(tmp_path, script, *args, words=()):
    env = {**os.environ, "TMPDIR": str(tmp_path), "PYTHONPATH": ROOT}
    done = subprocess.run([sys.executable, os.path.join(BENCH, script), *map(str, args)], capture_output=True,
                          text=True, env=env, timeout=120)
    message = done.stderr.strip()
    assert done.returncode == 2, (done.returncode, message[-2000:])
    assert len(message.splitlines()) == 1 and message.startswith("Error: "), message
    for word in words:
        assert word in message, (word, message)
    assert os.listdir(tmp_path) == [], os.listdir(tmp_path)  # no scratch folder (tempfile follows TMPDIR)
    return message


@pytest.mark.parametrize("args, words", [
    (["--every", 0], ["--every is '0'", "expected an integer of at least 1"]),
    (["--rounds", 20], ["--warmup is 50 but --rounds is 20", "expected a warm-up shorter than the run"]),
    (["--rounds", 3, "--warmup", 1, "--local-steps", 0], ["--local-steps is '0'"]),
    (["--tolerance", "nan"], ["--tolerance is 'nan'", "a number >= 0"]),
    (["--rounds", 3, "--warmup", 1, "--backend", "local", "--dataset", "bogus"], ["dataset is 'bogus'; expected"]),
])
def test_soak(tmp_path, args, words):
    refused(tmp_path, "soak.py", *args, words=words)


@pytest.mark.parametrize("args, words", [
    (["--settings", "hasfl,x"], ["--settings is 'hasfl,x'", "expected a comma list of hasfl, short, training"]),
    (["--placements", "auto,nowhere"], ["--placements is 'auto,nowhere'"]),
    (["--rounds", 0], ["--rounds is '0'", "at least 11"]),
    (["--repeats", "two"], ["--repeats is 'two'"]),
])
def test_bench_short_rounds(tmp_path, args, words):
    refused(tmp_path, "bench_short_rounds.py", *args, words=words)


@pytest.mark.parametrize("args, words", [
    (["--sizes", "100,x"], ["--sizes is '100,x'"]),
    (["--point", "later,100"], ["--point is 'later,100'", "MODE sync or async"]),
    (["--sizes", 100, "--concurrency", 10, "--buffer", 20], ["buffer_size is 20 but concurrency is 10"]),
    (["--profile", "p.prof"], ["--profile is 'p.prof' but --point is unset"]),
])
def test_bench_async(tmp_path, args, words):
    refused(tmp_path, "bench_async.py", *args, words=words)


@pytest.mark.parametrize("args, words", [
    (["--rounds", 2, "--drop", 2], ["--drop is 2 but --rounds is 2"]),
    (["--skip", "digits,everything"], ["--skip is 'digits,everything'"]),
    (["--synthetic-clients", 10], ["--synthetic-clients is '10'", "at least 100"]),
])
def test_bench_eval(tmp_path, args, words):
    refused(tmp_path, "bench_eval.py", *args, words=words)


def test_bench_evals_timers_wrap_calls_that_exist():
    sys.path.insert(0, BENCH)
    try:
        import bench_eval
    finally:
        sys.path.remove(BENCH)
    with bench_eval.timed_calls() as timers:  # AttributeError: Engine.evaluation_metrics, before
        assert timers.round == -1
