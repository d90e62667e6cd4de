"""Ray is ours unless the user says otherwise (issue 37 item 1), against a real foreign cluster: a `ray start --head`
of someone else's runs on the machine (its address in the Ray temp folder's ``ray_current_cluster``, exactly what a
bare ``ray.init()`` joins), RAY_ADDRESS is unset and no --address is given; `simulate` (the default backend: local
rounds, then the hand-off to Ray), `simulate --backend ray` and `sweep --backend ray` run through the CLI, each in a
process of its own, and each trains on a private Ray of its own: the foreign head's GCS never sees a job (a driver
of ours), so no cell ran with its code and its fixed CPU count refused nothing. On the former bare ``ray.init()``
all three fail: neither simulate run reached Ray ("When connecting to an existing cluster, num_cpus and
num_gpus must not be provided"), and the sweep's cell ran as a task of the foreign cluster (its job in the GCS).

The foreign head lives in a temp folder of its own (RAY_TMPDIR, for it and for our runs), so nothing here touches
/tmp/ray or another user's Ray; it is stopped by killing its own process group, never by `ray stop` (which stops
every Ray on the machine). The unit test of the call is tests/simulation/test_private_ray.py."""

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

import pytest
import yaml

pytest.importorskip("ray", reason="needs Ray")

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CLI = [sys.executable, "-c", "from hasfl_ray.cli.main import main; main()"]
TINY = ["--rounds", "2", "--clients", "4", "--clients-per-round", "2", "--quiet"]
#: The jobs (drivers) a cluster's GCS has seen, read without joining it (no job of the query's own) and without the
#: dashboard (which the foreign head does not run).
JOBS = ("import json, sys\n"
        "from ray._raylet import GcsClient\n"
        "jobs = GcsClient(address=sys.argv[1]).get_all_job_info(timeout=30).values()\n"
        "print(json.dumps([[job.driver_pid, job.entrypoint] for job in jobs]))\n")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def environment(ray_tmpdir: str, **extra: str) -> dict:
    """A user's shell: no RAY_ADDRESS, no auth mode an earlier ray.init of this test session left in os.environ, the
    repository's hasfl_ray first; Ray's temp folder (where `ray start` records its address) the foreign head's."""
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_AUTH_MODE")}
    env.update(RAY_TMPDIR=ray_tmpdir, RAY_USAGE_STATS_ENABLED="0", **extra)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (REPO, os.environ.get("PYTHONPATH", "")) if p)
    return env


class ForeignHead:
    """`ray start --head --block` in a session of its own (every process it starts is in its process group)."""

    def __init__(self, root: str, **auth: str):
        self.root, self.port = root, free_port()
        # auth off, explicitly (unless ``auth`` says otherwise): whether `ray start` turns token auth on depends on a
        # ~/.ray/auth_token of this machine; our runs join nothing, and a driver that did join (the former code) is
        # let in either way
        self.env = environment(root, **(auth or {"RAY_AUTH_MODE": "disabled"}))
        self.env.pop("PYTHONPATH")  # the foreign cluster's code is its own
        command = [sys.executable, "-m", "ray.scripts.scripts", "start", "--head", "--block",
                   f"--port={self.port}", "--num-cpus=1", "--include-dashboard=false",
                   f"--dashboard-port={free_port()}", f"--ray-client-server-port={free_port()}",
                   f"--dashboard-agent-listen-port={free_port()}", f"--object-store-memory={100 * 1024 ** 2}",
                   "--disable-usage-stats"]
        self.log = open(os.path.join(root, "head.log"), "w", encoding="utf-8")
        self.process = subprocess.Popen(command, env=self.env, stdout=self.log, stderr=subprocess.STDOUT,
                                        start_new_session=True, cwd=root)
        self.address_file = os.path.join(root, "ray", "ray_current_cluster")

    def wait_up(self, seconds: float = 60.0) -> str:
        """The address `ray start` recorded for a bare ``ray.init()`` to join."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                break
            if os.path.exists(self.address_file):
                with open(self.address_file, encoding="utf-8") as handle:
                    address = handle.read().strip()
                if address:
                    return address
            time.sleep(0.2)
        with open(self.log.name, encoding="utf-8") as handle:
            pytest.fail(f"the foreign Ray head did not start:\n{handle.read()[-3000:]}")

    def jobs(self) -> list:
        done = subprocess.run([sys.executable, "-c", JOBS, f"127.0.0.1:{self.port}"], env=self.env,
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr[-3000:]
        return json.loads(done.stdout.strip().splitlines()[-1])

    def stop(self) -> None:
        """Kill the head's process group (only it: ``ray stop`` would stop every Ray on the machine)."""
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.process.wait(timeout=30)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:  # the group's other processes, reaped by init
            try:
                os.killpg(self.process.pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.1)
        self.log.close()


@contextlib.contextmanager
def started_head(**auth):
    root = tempfile.mkdtemp(prefix="hrf-")  # short: Ray's unix sockets live under it
    head = None
    try:
        head = ForeignHead(root, **auth)
        assert head.wait_up().endswith(f":{head.port}")  # what a bare ray.init() joins
        yield head
    finally:
        if head is not None:
            head.stop()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def foreign_head():
    with started_head() as head:
        yield head


def run_cli(head, cwd, *args, **env):
    return subprocess.run([*CLI, *args], env=environment(head.root, **env), cwd=str(cwd), capture_output=True,
                          text=True, timeout=300)


@pytest.mark.parametrize("args, handoff_round, ray_from_round", [
    ([], "1", 1),  # the default backend: round 0 here, Ray (started in the background) from round 1, held there
    (["--backend", "ray"], "0", 0),  # Ray named: Ray from the first round (no hand-off to report, or one at 0)
], ids=["hand-off", "backend-ray"])
def test_simulate_starts_a_ray_of_its_own(foreign_head, tmp_path, args, handoff_round, ray_from_round):
    # the former code joined the foreign head, which refused its num_cpus: the hand-off's run went on here, a run
    # on Ray by name stopped
    out = tmp_path / "run"
    done = run_cli(foreign_head, tmp_path, "simulate", *TINY, *args, "--actors", "1", "--out", str(out),
                   HASFL_HANDOFF_ROUND=handoff_round)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary.get("ray_from_round", 0) == ray_from_round, (out / "log.txt").read_text()[-3000:]
    assert foreign_head.jobs() == []


def test_a_sweep_on_ray_starts_a_ray_of_its_own(foreign_head, tmp_path):
    # the former code ran the cells as tasks of the foreign cluster, with its installed code
    config = tmp_path / "one.yaml"
    config.write_text(yaml.safe_dump({"sweep": {"datasets": ["digits"], "algorithms": ["fedavg"], "seeds": [42]}}))
    out = tmp_path / "sweep"
    done = run_cli(foreign_head, tmp_path, "sweep", str(config), *TINY, "--backend", "ray", "--out", str(out))
    assert done.returncode == 0, done.stderr[-3000:]
    assert "one Ray task per cell" in done.stdout + done.stderr
    cells = json.loads((out / "sweep.json").read_text())["cells"]
    assert [(c["name"], c["status"]) for c in cells] == [("digits-fedavg-seed42", "done")]
    assert foreign_head.jobs() == []


#: The token of the head started with token authentication (another user's, or another shell's `ray start`).
HEAD_TOKEN = "a" * 64


def test_a_cluster_that_answers_but_refuses_us_is_one_sentence():
    """Battery 5's problem 16: RAY_ADDRESS of a head that refuses our token printed ~20 raw lines of Ray's C++ log
    ("gcs_client.cc: Failed to get cluster ID ... InvalidAuthToken") over 24 s, then said no cluster answered there;
    now one sentence saying it answered but refused us, with no Ray log line. With its token the probe lets the
    run through (it sends what ray.init would send)."""
    with started_head(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=HEAD_TOKEN) as head:
        address = f"127.0.0.1:{head.port}"
        for auth in ({}, {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": "b" * 64}):  # no token; a wrong one
            with tempfile.TemporaryDirectory() as cwd:
                done = run_cli(head, cwd, "simulate", *TINY, "--backend", "ray", "--actors", "1", "--out", "run",
                               RAY_ADDRESS=address, **auth)
                assert done.returncode == 2, done.stderr[-3000:]
                lines = (done.stdout + done.stderr).strip().splitlines()
                assert len(lines) == 1, lines
                assert lines[0].startswith(f"Error: RAY_ADDRESS in the environment is '{address}': a Ray cluster "
                                           "answered but refused the connection (InvalidAuthToken)"), lines[0]
                assert os.listdir(cwd) == []
        probe = ("import sys\nfrom hasfl_ray.simulation import probe_address\n"
                 "print(probe_address(sys.argv[1], 'RAY_ADDRESS in the environment'))\n")
        done = subprocess.run([sys.executable, "-c", probe, address], capture_output=True, text=True, timeout=120,
                              env=environment(head.root, RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=HEAD_TOKEN))
        assert done.returncode == 0 and done.stdout.strip() == address, done.stderr[-3000:]
