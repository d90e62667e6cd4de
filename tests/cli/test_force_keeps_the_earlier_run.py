"""``--force`` over an earlier run whose new start is refused for bad input (a plug-in's first dispatch): the earlier
run was cleared before the refusal, so a typo cost it. Now ``--force`` sets the earlier run aside inside its folder
(``engine/earlier_run.py``), puts it back byte for byte on a refused start, and deletes it once the new run records
its first line or ends; a folder a kill left in between is settled by the next start (never two runs read as one)."""

import os
import signal
import subprocess
import sys
import textwrap

import pytest

from hasfl_ray.engine import earlier_run
from hasfl_ray.engine.earlier_run import EARLIER, set_aside, settle
from sentences import invoke, refused

TINY = ["--rounds", 1, "--clients", 6, "--clients-per-round", 3, "--quiet", "--dataset", "digits", "--backend",
        "local"]
CHANNELS = "group 0 holds 1 of 32 channels at width"
PLUGINS = textwrap.dedent("""
    import os
    import signal

    from hasfl_ray import Algorithm


    class Channels(Algorithm):
        def channel_sets(self, round, client, width):
            return [[0]] * 3


    class Late(Algorithm):
        def channel_sets(self, round, client, width):
            return None if round == 0 else [[0]] * 3


    class Killed(Algorithm):
        def channel_sets(self, round, client, width):
            os.kill(os.getpid(), signal.SIGKILL)
""")


def files(root):
    """Every file under ``root`` with its bytes, and every folder (the whole run directory, to compare)."""
    found = {}
    for folder, dirs, names in os.walk(root):
        for name in dirs:
            found[os.path.relpath(os.path.join(folder, name), root) + "/"] = None
        for name in names:
            with open(os.path.join(folder, name), "rb") as handle:
                found[os.path.relpath(os.path.join(folder, name), root)] = handle.read()
    return found


@pytest.fixture
def earlier(tmp_path, monkeypatch):
    """A finished run of one round in tmp_path/run (with a checkpoint) and the plug-ins' path."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "policy.py").write_text(PLUGINS)
    out = tmp_path / "run"
    result = invoke("simulate", *TINY, "--checkpoint-every", 1, "--out", out)
    assert result.exit_code == 0, result.output
    assert (out / "checkpoints" / "latest.pt").exists() and (out / "summary.json").exists()
    return out, lambda name: f"{tmp_path / 'policy.py'}:{name}"


@pytest.mark.parametrize("mode", [[], ["--mode", "async", "--devices", "lognormal"]], ids=["rounds", "async"])
def test_a_refused_force_start_leaves_the_earlier_run_as_it_was(earlier, mode):
    out, plugin = earlier
    before = files(out)
    refused(invoke("simulate", *TINY, *mode, "--algorithm", plugin("Channels"), "--out", out, "--force"), CHANNELS)
    assert files(out) == before


def test_the_python_api_keeps_the_earlier_run_too(earlier):
    import hasfl_ray
    from hasfl_ray.errors import PluginInputError

    out, plugin = earlier
    before = files(out)
    with pytest.raises(PluginInputError, match=CHANNELS):
        hasfl_ray.simulate(algorithm=plugin("Channels"), rounds=1, clients=6, clients_per_round=3, backend="local",
                           out_dir=str(out), force=True)
    assert files(out) == before


def test_the_earlier_run_goes_once_the_new_run_records_its_first_line(earlier):
    """Round 0 of the new run is recorded (the earlier run is deleted then, seen from the callback), and the refusal
    at round 1 keeps the new run as it is: nothing of the earlier run is left beside it."""
    import hasfl_ray
    from hasfl_ray.errors import PluginInputError

    out, plugin = earlier
    seen = []

    class Watch(hasfl_ray.Callback):
        def on_round_end(self, line, run):
            seen.append(os.path.exists(out / EARLIER))

    with pytest.raises(PluginInputError, match=CHANNELS):
        hasfl_ray.simulate(algorithm=plugin("Late"), rounds=2, clients=6, clients_per_round=3, backend="local",
                           out_dir=str(out), force=True, callbacks=[Watch()])
    assert seen == [False]
    assert not (out / EARLIER).exists() and not (out / "summary.json").exists()
    assert "Late" in (out / "config.yaml").read_text()
    assert len((out / "metrics.jsonl").read_text().splitlines()) == 1


def test_a_force_run_that_finishes_leaves_only_the_new_run(earlier):
    out, _ = earlier
    result = invoke("simulate", *TINY[2:], "--rounds", 2, "--out", out, "--force")
    assert result.exit_code == 0, result.output
    assert EARLIER not in os.listdir(out)
    assert len((out / "metrics.jsonl").read_text().splitlines()) == 2


def test_a_start_killed_after_its_config_is_the_folders_run_and_a_later_force_clears_it(earlier):
    """A real SIGKILL at the new run's first dispatch (its config.yaml written, no line): the folder holds the new
    run's config.yaml and the earlier run set aside. A plain start there is refused as a folder holding a run (the
    new one; the earlier one is deleted then, never mixed in), and a later --force runs cleanly."""
    out, plugin = earlier
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    command = [sys.executable, "-c", "from hasfl_ray.cli.main import main; main()", "simulate", *map(str, TINY),
               "--algorithm", plugin("Killed"), "--out", str(out), "--force"]
    killed = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert (out / EARLIER / "summary.json").exists() and "Killed" in (out / "config.yaml").read_text()
    # the folder by its name in the current folder (tmp_path): the sentence's length is the program's, not tmp_path's
    refused(invoke("simulate", *TINY, "--out", out.name), "already holds a run")
    assert EARLIER not in os.listdir(out) and "Killed" in (out / "config.yaml").read_text()
    assert not (out / "summary.json").exists() and not (out / "checkpoints" / "latest.pt").exists()
    result = invoke("simulate", *TINY, "--out", out, "--force")
    assert result.exit_code == 0, result.output
    assert EARLIER not in os.listdir(out) and len((out / "metrics.jsonl").read_text().splitlines()) == 1


def test_a_kill_at_any_rename_is_settled_to_one_run(earlier, monkeypatch):
    """Setting aside and putting back are one rename an entry; a kill after any of them leaves a folder that
    :func:`settle` makes the earlier run again, byte for byte (config.yaml moves first and comes back last)."""
    out, _ = earlier
    before = files(out)
    count = len(os.listdir(out))
    real = os.rename

    def killed_after(k):
        calls = []

        def rename(src, dst):
            if len(calls) == k:
                raise KeyboardInterrupt("killed")
            calls.append(src)
            real(src, dst)
        return rename

    for k in range(count):  # a kill k renames into set_aside
        monkeypatch.setattr(earlier_run.os, "rename", killed_after(k))
        with pytest.raises(KeyboardInterrupt):
            set_aside(str(out))
        monkeypatch.setattr(earlier_run.os, "rename", real)
        settle(str(out))
        assert files(out) == before, k
    for k in range(count):  # a kill k renames into putting it back (the start's own log.txt removed first)
        set_aside(str(out))
        (out / "log.txt").write_text("the refused start's log\n")
        monkeypatch.setattr(earlier_run.os, "rename", killed_after(k))
        with pytest.raises(KeyboardInterrupt):
            earlier_run.restore(str(out))
        monkeypatch.setattr(earlier_run.os, "rename", real)
        settle(str(out))
        assert files(out) == before, k


def test_a_start_killed_before_its_config_puts_the_earlier_run_back_for_resume(earlier):
    """Killed after the earlier run was set aside and the start's log.txt opened, before config.yaml: the next
    invocation there reads the earlier run (settled before its checks), so --resume continues it."""
    out, _ = earlier
    before = files(out)
    set_aside(str(out))
    (out / "log.txt").write_text("the killed start's log\n")
    result = invoke("simulate", "--out", out, "--resume", "--rounds", 2, "--force", "--quiet")  # its stored config
    assert result.exit_code == 0, result.output
    assert EARLIER not in os.listdir(out)
    lines = (out / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 2 and lines[0].encode() + b"\n" == before["metrics.jsonl"]
