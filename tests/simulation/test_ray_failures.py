"""Ray's failure paths, each one sentence (issue 24 rows 15, 24, 26), and the early Ray start (item 8): an address
that does not answer, from --address or RAY_ADDRESS, for simulate and sweep; Ctrl-C while it is probed; Ray that
cannot start under a sweep; a dead server actor; the default run, trained here until Ray takes over, bit-identical
to the local backend, and going on here when Ray cannot start."""

import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

ray = pytest.importorskip("ray", reason="needs Ray")

from click.testing import CliRunner  # noqa: E402

import hasfl_ray.simulation as simulation  # noqa: E402
from hasfl_ray.cli.main import main  # noqa: E402
from hasfl_ray.simulation.backend import RayBackend  # noqa: E402

SMALL = ["--rounds", "3", "--clients", "6", "--clients-per-round", "3", "--seed", "3", "--quiet"]
SWEEP = "sweep: {algorithms: [hasfl], seeds: [42]}\nrounds: 2\nclients: 6\nclients_per_round: 3\n"


@pytest.fixture(autouse=True)
def no_ray(monkeypatch):
    """Every test starts without Ray in this process (the run starts or joins it) and RAY_ADDRESS unset."""
    if ray.is_initialized():
        ray.shutdown()
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    yield
    assert not ray.is_initialized()  # whatever happened, the run stopped the Ray it started


def closed_port():
    """A local port nothing listens on (connection refused)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def sha(out):
    return json.loads((out / "summary.json").read_text())["params_sha256"]


@pytest.mark.parametrize("command", ["simulate", "sweep"])
@pytest.mark.parametrize("source", ["--address", "RAY_ADDRESS"])
def test_an_unreachable_address_is_one_sentence_naming_where_it_came_from(command, source, tmp_path, monkeypatch):
    # issue 24 row 15: a stale address gave Ray's GCS warnings for minutes (simulate) or 70-120 s of silence (sweep),
    # and simulate with RAY_ADDRESS blamed num_cpus
    address = f"127.0.0.1:{closed_port()}"
    args = ["simulate", *SMALL] if command == "simulate" else ["sweep", str(tmp_path / "S.yaml"), "--backend", "ray"]
    (tmp_path / "S.yaml").write_text(SWEEP)
    if source == "RAY_ADDRESS":
        monkeypatch.setenv("RAY_ADDRESS", address)
    else:
        args += ["--address", address]
    start = time.monotonic()
    result = CliRunner().invoke(main, [*args, "--out", str(tmp_path / "out")])
    assert time.monotonic() - start < 30
    assert result.exit_code == 2, result.output
    named = "address is" if source == "--address" else "RAY_ADDRESS in the environment is"
    assert result.output.startswith(f"Error: {named} {address!r} but no Ray cluster answered there")
    assert "Connection refused" in result.output and len(result.output.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()  # refused before anything was made


@pytest.mark.parametrize("address, port", [("127.0.0.1:99999", "99999"), ("ray://127.0.0.1:0", "0")])
def test_a_port_out_of_range_is_named_as_such(address, port, tmp_path):
    # h60: 127.0.0.1:99999 said "Connection refused" (the kernel folded the port into another): a typo, not a cluster
    result = CliRunner().invoke(main, ["simulate", *SMALL, "--address", address, "--out", str(tmp_path / "o")])
    assert result.exit_code == 2, result.output
    assert result.output.startswith(f"Error: address is {address!r} but its port {port} is out of range; expected "
                                    "a port from 1 to 65535"), result.output
    assert "Connection refused" not in result.output and len(result.output.strip().splitlines()) == 1
    assert not (tmp_path / "o").exists()


def test_a_port_that_does_not_answer_as_ray_is_refused_after_the_probe(tmp_path, monkeypatch):
    # issue 24 row 15 (cousin): something listens there but never answers as a Ray cluster does
    monkeypatch.setattr(simulation, "PROBE_SECONDS", 0.5)
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        address = "127.0.0.1:%d" % listener.getsockname()[1]
        result = CliRunner().invoke(main, ["simulate", *SMALL, "--address", address, "--out", str(tmp_path / "o")])
    assert result.exit_code == 2, result.output
    assert f"address is {address!r} but no Ray cluster answered there ({address}: timed out)" in result.output


def test_ctrl_c_while_an_address_is_probed_stops_the_run_at_once(tmp_path):
    # issue 24 row 15: SIGINT during the wait was ignored for seconds
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        address = "127.0.0.1:%d" % listener.getsockname()[1]
        process = subprocess.Popen([sys.executable, "-c", "from hasfl_ray.cli.main import main; main()", "simulate",
                                    *SMALL, "--address", address, "--out", str(tmp_path / "o")],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        listener.settimeout(120)
        connection, _ = listener.accept()  # the probe connected: the run now waits for an answer (5 s)
        with connection:
            process.send_signal(signal.SIGINT)
            start = time.monotonic()
            _, stderr = process.communicate(timeout=60)
            waited = time.monotonic() - start
    assert process.returncode != 0 and waited < 3, (waited, stderr)
    assert "Traceback" not in stderr
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("command", ["sweep", "simulate"])
def test_ray_that_cannot_start_is_one_sentence_for_sweep_and_simulate(command, tmp_path, monkeypatch):
    # issue 24 row 26: a Ray sweep whose Ray cannot start (HOME read-only) gave the OSError traceback of ray.init
    def read_only_home(*args, **kwargs):
        raise OSError(30, "Read-only file system", "/home/user/.ray")

    monkeypatch.setattr(ray, "init", read_only_home)
    (tmp_path / "S.yaml").write_text(SWEEP)
    # a simulate that waits for Ray before its first round (a fault aimed at Ray; the default hands over instead)
    args = ["sweep", str(tmp_path / "S.yaml"), "--backend", "ray"] if command == "sweep" else \
        ["simulate", *SMALL, "--fault-inject", "kill-trainer@1"]
    result = CliRunner().invoke(main, [*args, "--out", str(tmp_path / "out")])
    assert result.exit_code == 2, result.output
    assert result.output.startswith("Error: Ray could not start on this machine ([Errno 30] Read-only file system: "
                                    "'/home/user/.ray'); expected a machine where `ray start --head` works")
    assert len(result.output.strip().splitlines()) == 1


@pytest.fixture(scope="module")
def local_run(tmp_path_factory):
    """The uninterrupted run on the local backend (its params_sha256 is what every Ray run must give)."""
    out = tmp_path_factory.mktemp("local") / "run"
    result = CliRunner().invoke(main, ["simulate", *SMALL, "--backend", "local", "--out", str(out)])
    assert result.exit_code == 0, result.output
    return out


def test_the_default_run_trains_here_until_ray_takes_over_and_equals_the_local_backend(local_run, tmp_path,
                                                                                       monkeypatch):
    # issue 24 item 8: Ray and its actors start in threads while the data loads and the first rounds run in this
    # process; Ray takes over at a round boundary (held to round 1 here) and the result does not change by a bit
    monkeypatch.setenv("HASFL_HANDOFF_ROUND", "1")
    out = tmp_path / "ray"
    result = CliRunner().invoke(main, ["simulate", *SMALL, "--out", str(out)])  # no --backend: Ray
    assert result.exit_code == 0, result.output
    assert "backend: ray" in (out / "config.yaml").read_text()
    assert "# actors: 2\n" in (out / "config.yaml").read_text()  # the plan, known before Ray started
    assert json.loads((out / "summary.json").read_text())["ray_from_round"] == 1
    assert sha(out) == sha(local_run)


def test_ray_that_cannot_start_while_the_first_rounds_run_here_is_one_warning_and_the_run_goes_on(local_run, tmp_path,
                                                                                                  monkeypatch):
    # issue 24 item 8: Ray failing to start once the rounds began here: one warning, the run ends here, same bits
    def read_only_home(*args, **kwargs):
        raise OSError(30, "Read-only file system", "/home/user/.ray")

    monkeypatch.setattr(ray, "init", read_only_home)
    monkeypatch.setenv("HASFL_HANDOFF_ROUND", "1")  # the failure is met at round 1 (it could come at any round)
    out = tmp_path / "run"
    result = CliRunner().invoke(main, ["simulate", *SMALL, "--out", str(out)])
    assert result.exit_code == 0, result.output
    warning = ("Ray could not start on this machine ([Errno 30] Read-only file system: '/home/user/.ray'); the run "
               "continues in this process, results are identical")
    assert warning in (out / "log.txt").read_text()
    assert json.loads((out / "summary.json").read_text())["ray_from_round"] is None
    assert sha(out) == sha(local_run)


def test_a_dead_server_actor_is_one_sentence_with_the_resume_command(local_run, tmp_path, monkeypatch):
    # issue 24 row 24: kill -9 of the server actor gave Ray's ActorDiedError text and a 40-line traceback (the
    # server on an actor of its own: on a CPU run auto puts it in the driver, where there is none to lose)
    run_round = RayBackend.run_round

    def kill_the_server_in_round_1(self, tasks, weights, server_lr):
        if tasks[0].round == 1:
            os.kill(self.places[-1]["pid"], signal.SIGKILL)  # places: the trainers', then the server's
            time.sleep(0.5)
        return run_round(self, tasks, weights, server_lr)

    monkeypatch.setattr(RayBackend, "run_round", kill_the_server_in_round_1)
    monkeypatch.setenv("HASFL_HANDOFF_ROUND", "0")  # Ray from the first round (not the local rounds of a handoff)
    out = tmp_path / "run"
    result = CliRunner().invoke(main, ["simulate", *SMALL, "--backend", "ray", "--server-placement", "actor",
                                       "--checkpoint-every", "1", "--out", str(out)])
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output and "ActorDiedError:" not in result.output
    errors = [line for line in result.output.splitlines() if not line.startswith("\x1b[33m(raylet)")]
    assert errors == [  # beside Ray's own one-line '(raylet) A worker died' notice, when it comes in time
        "Error: the Ray server actor died (ActorDiedError); the checkpoint after round 0 is intact, so --resume "
        f"continues from it: hasfl-ray simulate --out {out} --resume"]
    assert "ActorDiedError" in (out / "log.txt").read_text()  # Ray's report: in the log only
    monkeypatch.undo()
    resumed = CliRunner().invoke(main, ["simulate", "--out", str(out), "--resume", "--backend", "local", "--quiet"])
    assert resumed.exit_code == 0, resumed.output
    assert sha(out) == sha(local_run)
