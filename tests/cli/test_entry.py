"""Ctrl-C or SIGTERM during start-up (issue 37 item 7, issue 49 item 1): the console script enters through
hasfl_ray.cli.entry, which answers both signals before it imports anything heavy and never lets one land inside an
import (hasfl_ray/interrupts.py), so a signal while the CLI, torch, numpy, the data or Ray load ends with one line
and exit status 130 or 143, nothing made and nothing run: never a half-imported numpy blamed on the dataset, a
signal swallowed by torch's native import, an abort in pybind11 or a traceback. Once a run started, its own
handlers checkpoint and stop it (tests/simulation/test_interrupt.py).

Each signal is sent by the process to itself at a named point of its start-up (tests/cli/signal_at.py: while a
module is imported, or as a function is called), never by a timer, so every phase is hit on every machine."""

import json
import os
import signal
import subprocess
import sys
import textwrap

import numpy
import pytest

from hasfl_ray.cli import entry

SIGNAL_AT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "signal_at.py")
TINY = ["--backend", "local", "--rounds", "2", "--clients", "6", "--clients-per-round", "3", "--quiet"]
STARTING = "while hasfl-ray was starting; nothing was run."
COMMAND = "before the command finished."
#: numpy's compiled core, imported in the middle of ``import numpy`` (itself in the middle of ``import torch``).
NUMPY_CORE = ("numpy._core" if int(numpy.__version__.split(".")[0]) >= 2 else "numpy.core") + "._multiarray_umath"
needs_ray = pytest.mark.skipif(not __import__("importlib").util.find_spec("ray"), reason="needs Ray")

#: A dataset plug-in (the digits) whose load() imports a module: a signal inside an import while the data loads.
PLUGIN = textwrap.dedent("""
    import os, sys

    from hasfl_ray.data.digits import DigitsDataset


    class Importing(DigitsDataset):
        def load(self, config):
            sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
            import imported_while_loading  # noqa: F401
            return super().load(config)
    """)


def signalled(name, when, *arguments, cwd):
    """`hasfl-ray ARGUMENTS` with signal ``name`` (``SIGTERM*2``: twice) sent at ``when`` (see signal_at.py)."""
    done = subprocess.run([sys.executable, SIGNAL_AT, name, when, "--", *arguments], capture_output=True, text=True,
                          timeout=300, cwd=str(cwd))
    assert "never came" not in done.stderr, done.stderr  # (exit 99: the point named is not on this path)
    return done


def assert_one_line(done, name, where):
    """Exit 128 + the signal's number, and stderr one line (click's blank line aside) naming the signal."""
    number = getattr(signal, name.partition("*")[0])
    assert done.returncode == 128 + number, (done.returncode, done.stderr)
    assert "Traceback" not in done.stderr and "Error" not in done.stderr, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert lines == [f"Interrupted by {signal.Signals(number).name} {where}"], done.stderr


@pytest.fixture
def plugin(tmp_path):
    (tmp_path / "importing.py").write_text(PLUGIN)
    (tmp_path / "imported_while_loading.py").write_text("WHAT = 'a module the dataset imports as it loads'\n")
    return f"{tmp_path / 'importing.py'}:Importing"


def test_importing_hasfl_ray_imports_nothing_heavy():
    done = subprocess.run([sys.executable, "-c", "import sys, hasfl_ray, hasfl_ray.cli.entry; "
                           "print(sorted(m for m in ('torch', 'numpy', 'click', 'yaml') if m in sys.modules))"],
                          capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


# simulate: the signal, the point of start-up it is sent at, and the sentence that says where it came
SIMULATE_PHASES = [
    *((name, when, STARTING) for name in ("SIGINT", "SIGTERM") for when in (
        "import:click",  # the command line loads
        "import:torch._C",  # torch's native part (pybind11 calls back into Python from it)
        f"import:{NUMPY_CORE}",  # numpy's core, imported by torch's native code: half-imported, or swallowed
    )),
    ("SIGTERM", "import:hasfl_ray.engine.engine", COMMAND),  # the engine the command imports
    ("SIGINT", "import:imported_while_loading", COMMAND),  # an import while the dataset loads
    ("SIGTERM", "call:hasfl_ray.data.digits:load_digits_federated", COMMAND),  # the loading, outside any import
]


@pytest.mark.parametrize("name, when, where", SIMULATE_PHASES)
def test_a_signal_while_simulate_starts_is_one_line_and_nothing_runs(tmp_path, plugin, name, when, where):
    dataset = ["--dataset", plugin] if "imported_while_loading" in when else []
    done = signalled(name, when, "simulate", *TINY, *dataset, "--out", "run", cwd=tmp_path)
    assert_one_line(done, name, where)
    assert done.stdout == "" and not (tmp_path / "run").exists()  # no summary, no run directory


def test_a_second_signal_while_the_first_waits_for_an_import_stops_at_once(tmp_path):
    done = signalled("SIGINT*2", f"import:{NUMPY_CORE}", "simulate", *TINY, "--out", "run", cwd=tmp_path)
    assert_one_line(done, "SIGINT", "again while an import was still running; stopped at once.")
    assert done.stdout == "" and not (tmp_path / "run").exists()


def test_a_signal_at_the_first_round_stops_the_run_with_its_own_handlers(tmp_path):
    done = signalled("SIGTERM", "call:hasfl_ray.engine.engine:Engine._loop", "simulate", *TINY, "--out", "run",
                     cwd=tmp_path)
    assert done.returncode == 143 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.splitlines()[-1].startswith("Stopped by SIGTERM after 0 completed rounds"), done.stderr
    assert not (tmp_path / "run" / "summary.json").exists()
    assert (tmp_path / "run" / "metrics.jsonl").read_text() == ""  # the run did not go on


def test_a_runs_second_sigterm_is_reported_as_sigterm(tmp_path):
    done = signalled("SIGTERM*2", "call:hasfl_ray.engine.engine:Engine._loop", "simulate", *TINY, "--out", "run",
                     cwd=tmp_path)
    assert done.returncode == 143 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.splitlines()[-1] == f"Interrupted by SIGTERM {COMMAND}", done.stderr  # was: by SIGINT, 130
    assert not (tmp_path / "run" / "summary.json").exists()


@needs_ray
@pytest.mark.parametrize("name, when", [("SIGTERM", "call:hasfl_ray.simulation.backend:connect_ray"),
                                        ("SIGINT", "import:ray._raylet")])
def test_a_signal_while_ray_starts_is_one_line(tmp_path, name, when):
    """Ray starts in a thread of its own while the data loads: the signal, sent from that thread, ends the command
    wherever the main thread is (in an import: as it ends), and nothing is made."""
    done = signalled(name, when, "simulate", *TINY[2:], "--backend", "ray", "--actors", "1", "--out", "run",
                     cwd=tmp_path)
    assert done.returncode == 128 + getattr(signal, name), (done.returncode, done.stderr)
    assert "Traceback" not in done.stderr and "terminate called" not in done.stderr, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"Interrupted by {name} "), done.stderr
    assert not (tmp_path / "run").exists()


@pytest.fixture
def sweep_file(tmp_path):
    (tmp_path / "s.yaml").write_text("sweep:\n  algorithms: [hasfl]\n  seeds: [42]\n"
                                     "rounds: 2\nclients: 6\nclients_per_round: 3\n")
    return "s.yaml"


@pytest.mark.parametrize("name, when, where", [
    ("SIGTERM", "import:click", STARTING),
    ("SIGINT", f"import:{NUMPY_CORE}", STARTING),
    ("SIGTERM", "import:torch._C", STARTING),
    ("SIGINT", "import:hasfl_ray.sweep", COMMAND),  # the sweep package the command imports
])
def test_a_signal_while_sweep_starts_is_one_line_and_no_cell_runs(tmp_path, sweep_file, name, when, where):
    done = signalled(name, when, "sweep", sweep_file, "--backend", "local", "--quiet", "--out", "sw", cwd=tmp_path)
    assert_one_line(done, name, where)
    assert not (tmp_path / "sw").exists()


def test_a_signal_while_a_sweep_checks_its_cells_data_leaves_no_folder(tmp_path, sweep_file):
    """The sweep loads each cell's data once before its folder is made (sweep/data_check.py): a signal there."""
    done = signalled("SIGTERM", "call:hasfl_ray.data.digits:load_digits_federated", "sweep", sweep_file, "--backend",
                     "local", "--quiet", "--out", "sw", cwd=tmp_path)
    assert_one_line(done, "SIGTERM", "before the command finished.")
    assert not (tmp_path / "sw").exists()


def test_a_signal_while_a_sweeps_cell_loads_its_data_stops_the_sweep(tmp_path, sweep_file):
    done = signalled("SIGTERM", "call:hasfl_ray.data.digits:load_digits_federated@2", "sweep", sweep_file,
                     "--backend", "local", "--quiet", "--out", "sw", cwd=tmp_path)  # 2nd: the cell's, after the check
    assert done.returncode == 143 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.splitlines()[-1].startswith("Stopped by SIGTERM: 1 of 1 cells did not finish"), done.stderr
    status = {c["name"]: c["status"] for c in json.loads((tmp_path / "sw" / "sweep.json").read_text())["cells"]}
    assert status == {"digits-hasfl-seed42": "interrupted"}


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    from click.testing import CliRunner

    from hasfl_ray.cli.main import main

    folder = tmp_path_factory.mktemp("runs")
    done = CliRunner().invoke(main, ["simulate", *TINY, "--out", str(folder / "a")])
    assert done.exit_code == 0, done.output
    return folder


@pytest.mark.parametrize("name, when, where", [
    ("SIGINT", f"import:{NUMPY_CORE}", STARTING),
    ("SIGTERM", "import:scipy", COMMAND),  # the analysis the command imports
    ("SIGINT", "import:matplotlib", COMMAND),  # the figures', once the tables are made
])
def test_a_signal_while_report_starts_is_one_line_and_no_figure_is_made(tmp_path, finished_run, name, when, where):
    done = signalled(name, when, "report", str(finished_run), "--out", "rep", cwd=tmp_path)
    assert_one_line(done, name, where)
    assert not list(tmp_path.glob("rep/*.png"))


@pytest.mark.parametrize("name, when, where", [
    ("SIGTERM", f"import:{NUMPY_CORE}", STARTING),
    ("SIGINT", "import:imported_while_loading", COMMAND),
    ("SIGTERM", "call:hasfl_ray.data.digits:load_digits_federated", COMMAND),
])
def test_a_signal_while_data_inspect_loads_is_one_line(tmp_path, plugin, name, when, where):
    dataset = plugin if "imported_while_loading" in when else "digits"
    done = signalled(name, when, "data", "inspect", "--dataset", dataset, "--clients", "6", cwd=tmp_path)
    assert_one_line(done, name, where)
    assert done.stdout == ""  # no partition printed


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
