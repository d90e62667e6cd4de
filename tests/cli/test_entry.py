"""Ctrl-C during start-up prints no traceback (issue 37 item 7): the console script enters through
hasfl_ray.cli.entry, which imports nothing heavy before it can answer a signal, so SIGINT or SIGTERM while the CLI,
torch or a command's subsystem still load ends with one line and exit status 130 or 143, and nothing is made;
once a run started, its own handlers checkpoint and stop it (tests/simulation/test_interrupt.py)."""

import signal
import subprocess
import sys

import pytest

from hasfl_ray.cli import entry

# The console script's code path, with a timer that sends the signal while the imports (or the data) still load.
SCRIPT = ("import os, signal, sys, threading; threading.Timer(float(sys.argv[1]), os.kill, (os.getpid(), "
          "getattr(signal, sys.argv[2]))).start(); sys.argv[1:3] = []; "
          "from hasfl_ray.cli.entry import main; main()")


def test_importing_hasfl_ray_imports_nothing_heavy():
    done = subprocess.run([sys.executable, "-c", "import sys, hasfl_ray, hasfl_ray.cli.entry; "
                           "print(sorted(m for m in ('torch', 'numpy', 'click', 'yaml') if m in sys.modules))"],
                          capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


@pytest.mark.parametrize("delay, name", [(0.05, "SIGINT"), (0.4, "SIGINT"), (0.4, "SIGTERM")])
def test_a_signal_while_hasfl_ray_starts_is_one_line_and_no_traceback(tmp_path, delay, name):
    out = tmp_path / "run"
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(delay), name, "simulate", "--backend", "local",
                           "--rounds", "200", "--quiet", "--out", str(out)], capture_output=True, text=True,
                          timeout=300)
    number = getattr(signal, name)
    assert done.returncode == 128 + number, (done.returncode, done.stderr)
    assert "Traceback" not in done.stderr and "KeyboardInterrupt" not in done.stderr, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and (lines[0].startswith(f"Interrupted by {name}") or
                                lines[0].startswith(f"Stopped by {name}")), done.stderr


def test_an_interrupt_while_the_cli_module_loads_is_the_starting_sentence(monkeypatch, capsys):
    import builtins

    real_import = builtins.__import__

    def interrupting(name, *args, **kwargs):
        if name == "hasfl_ray.cli.main":
            raise KeyboardInterrupt
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", interrupting)
    with pytest.raises(SystemExit) as stopped:
        entry.main(["--help"])
    assert stopped.value.code == 130
    assert capsys.readouterr().err == "Interrupted by SIGINT while hasfl-ray was starting; nothing was run.\n"
