"""Interrupts: SIGINT (Ctrl-C) or SIGTERM stops a run at the end of the current client, writes a checkpoint, shuts
down every process the run started, prints the command that resumes it and exits 130/143; resuming gives the
same params_sha256 as a run never interrupted."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from click.testing import CliRunner

from hasfl_ray.cli.main import main
from hasfl_ray.engine.checkpoint import load_checkpoint

ARGS = ["--rounds", "14", "--clients", "8", "--clients-per-round", "4", "--seed", "9", "--checkpoint-every", "3",
        "--quiet"]
HASFL_RAY = [sys.executable, "-c", "from hasfl_ray.cli.main import main; main()"]


def descendants(pid):
    """Every living process below ``pid`` (from /proc), so the test can see what a run started."""
    children = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", encoding="utf-8") as handle:
                    fields = handle.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            children.setdefault(int(fields[1]), []).append(int(entry))
    found, stack = set(), [pid]
    while stack:
        for child in children.get(stack.pop(), []):
            if child not in found:
                found.add(child)
                stack.append(child)
    return found


def alive(pid):
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def interrupt_after(args, out, lines, signal_number, timeout=240):
    """Start `hasfl-ray simulate`, send ``signal_number`` once ``lines`` rounds are written; returns (process, stderr,
    the processes it had started)."""
    process = subprocess.Popen(HASFL_RAY + ["simulate", *args, "--out", str(out)], stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, text=True)
    metrics = out / "metrics.jsonl"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and process.poll() is None:
        if metrics.exists() and len(metrics.read_text().splitlines()) >= lines:
            break
        time.sleep(0.05)
    assert process.poll() is None, process.stderr.read()
    started = descendants(process.pid)
    os.kill(process.pid, signal_number)
    _, stderr = process.communicate(timeout=120)
    return process, stderr, started


@pytest.fixture(scope="module")
def reference_sha(tmp_path_factory):
    """params_sha256 of the run never interrupted (ARGS on the local backend), run once for the module's three
    tests."""
    out = tmp_path_factory.mktemp("reference") / "ref"
    result = CliRunner().invoke(main, ["simulate", "--backend", "local", *ARGS, "--out", str(out)])
    assert result.exit_code == 0, result.output
    return json.loads((out / "summary.json").read_text())["params_sha256"]


@pytest.mark.skipif(not __import__("importlib").util.find_spec("ray"), reason="needs Ray")
def test_sigint_mid_round_on_ray_checkpoints_cleans_up_and_resumes_identically(tmp_path, monkeypatch, reference_sha):
    monkeypatch.setenv("HASFL_HANDOFF_ROUND", "0")  # Ray from the first round: the signal comes while Ray trains
    out = tmp_path / "run"
    process, stderr, started = interrupt_after(["--backend", "ray", "--actors", "2", *ARGS], out, 4, signal.SIGINT)
    assert process.returncode == 130, stderr
    assert f"resume with: hasfl-ray simulate --out {out} --resume" in stderr
    assert "Traceback" not in stderr
    assert started  # Ray's processes were children of the run ...
    time.sleep(2)
    assert [pid for pid in started if alive(pid)] == []  # ... and none is left
    done = load_checkpoint(str(out)).round
    assert done >= 4 and len((out / "metrics.jsonl").read_text().splitlines()) == done
    assert not (out / "summary.json").exists()

    resumed = CliRunner().invoke(main, ["simulate", "--out", str(out), "--resume", "--quiet"])  # as printed
    assert resumed.exit_code == 0, resumed.output
    assert json.loads((out / "summary.json").read_text())["params_sha256"] == reference_sha


def test_sigterm_on_the_local_backend_exits_143_and_resumes_identically(tmp_path, reference_sha):
    out = tmp_path / "run"
    process, stderr, _ = interrupt_after(["--backend", "local", *ARGS], out, 2, signal.SIGTERM)
    assert process.returncode == 143, stderr
    assert "Stopped by SIGTERM" in stderr and "--resume" in stderr and "Traceback" not in stderr
    assert load_checkpoint(str(out)).round >= 2
    resumed = CliRunner().invoke(main, ["simulate", "--out", str(out), "--resume", "--quiet"])
    assert resumed.exit_code == 0, resumed.output
    assert json.loads((out / "summary.json").read_text())["params_sha256"] == reference_sha


@pytest.mark.skipif(not __import__("importlib").util.find_spec("ray"), reason="needs Ray")
def test_sigterm_while_ray_starts_beside_the_first_rounds_stops_everything_it_started(tmp_path, monkeypatch,
                                                                                      reference_sha):
    # issue 24 item 8: the default run trains here while Ray and its actors start in threads; a stop then checkpoints,
    # exits 143 and leaves no Ray process (the start is waited for, a bounded time, then stopped)
    monkeypatch.setenv("HASFL_HANDOFF_ROUND", "1000")  # Ray never takes over: the signal comes during the handoff
    out = tmp_path / "run"
    process, stderr, started = interrupt_after(ARGS, out, 2, signal.SIGTERM)
    assert process.returncode == 143, stderr
    assert "Stopped by SIGTERM" in stderr and "--resume" in stderr and "Traceback" not in stderr
    time.sleep(2)
    assert [pid for pid in started if alive(pid)] == []
    assert [pid for pid in descendants(process.pid) if alive(pid)] == []
    assert load_checkpoint(str(out)).round >= 2
    resumed = CliRunner().invoke(main, ["simulate", "--out", str(out), "--resume", "--backend", "local", "--quiet"])
    assert resumed.exit_code == 0, resumed.output
    assert json.loads((out / "summary.json").read_text())["params_sha256"] == reference_sha
