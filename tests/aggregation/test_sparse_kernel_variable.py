"""HASFL_SPARSE_CUDA_KERNEL (the CUDA kernel of index sets and masks, docs/install.md) with a value other than
tabled or serial: refused only deep in the CUDA op, on a card, at the first aggregation of a run (a RuntimeError, the
run folder made); on a machine without one, taken in silence. Now one sentence on every device: at the start of
every command of the CLI (exit status 2, nothing written), where a run starts (hasfl_ray.simulate) and in the Python
entry that calls the op (hasfl_ray/ops/calls.py)."""

import os

import pytest
import torch
from click.testing import CliRunner

from hasfl_ray.aggregation import aggregate_updates
from hasfl_ray.cli.main import main
from hasfl_ray.errors import ConfigError
from hasfl_ray.ops import aggregate as ops
from hasfl_ray.ops.calls import sparse_cuda_kernel
from test_sparse import random_round

WORDS = ("HASFL_SPARSE_CUDA_KERNEL is 'fast'", "expected tabled (the default) or serial")
TINY = ["--dataset", "digits", "--clients", "4", "--clients-per-round", "2", "--rounds", "1", "--backend", "local",
        "--quiet"]


def invoke(*args):
    return CliRunner().invoke(main, list(args))


@pytest.mark.parametrize("value, kernel", [(None, "tabled"), ("", "tabled"), ("tabled", "tabled"),
                                           ("serial", "serial")])
def test_the_accepted_values(monkeypatch, value, kernel):
    if value is None:
        monkeypatch.delenv("HASFL_SPARSE_CUDA_KERNEL", raising=False)
    else:
        monkeypatch.setenv("HASFL_SPARSE_CUDA_KERNEL", value)
    assert sparse_cuda_kernel() == kernel


@pytest.mark.parametrize("value", ["fast", "Serial", " serial", "tabled,serial"])
def test_any_other_value_is_one_sentence(monkeypatch, value):
    monkeypatch.setenv("HASFL_SPARSE_CUDA_KERNEL", value)
    with pytest.raises(ConfigError, match=f"HASFL_SPARSE_CUDA_KERNEL is {value!r} in the environment; expected "
                                          "tabled"):
        sparse_cuda_kernel()


@pytest.mark.parametrize("command", [
    ["simulate", "--algorithm", "fiarse", *TINY, "--out", "run"],
    ["bench", "aggregate", "--layout", "index", "--clients", "2"],
    ["info"],
])
def test_every_command_refuses_it_before_it_starts(tmp_path, monkeypatch, command):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HASFL_SPARSE_CUDA_KERNEL", "fast")
    result = invoke(*command)
    message = result.output.strip()
    assert result.exit_code == 2 and len(message.splitlines()) == 1, message
    assert message.startswith("Error: ") and all(word in message for word in WORDS), message
    assert os.listdir(tmp_path) == []  # no run folder, no benchmark output


def test_help_still_answers(monkeypatch):
    monkeypatch.setenv("HASFL_SPARSE_CUDA_KERNEL", "fast")
    for command in (["--help"], ["simulate", "--help"], ["bench", "aggregate", "--help"]):
        result = invoke(*command)
        assert result.exit_code == 0 and "Usage" in result.output, result.output


def test_a_run_from_python_refuses_it_before_its_folder(tmp_path, monkeypatch):
    from hasfl_ray import simulate

    monkeypatch.setenv("HASFL_SPARSE_CUDA_KERNEL", "fast")
    with pytest.raises(ConfigError, match=WORDS[0]):
        simulate(dataset="digits", algorithm="fiarse", clients=4, clients_per_round=2, rounds=1, backend="local",
                 out_dir=str(tmp_path / "run"))
    assert not os.path.exists(tmp_path / "run")


@pytest.mark.skipif(not ops.available(), reason="needs the compiled extension hasfl_ray._C")
def test_the_python_entry_of_the_op_refuses_it_on_every_device(monkeypatch):
    """On the CPU the op itself ignores the variable: the value a card would refuse is refused here alike."""
    shapes, updates, weights, blocks = random_round(7, 3, torch.float32, ("index", "mask"))
    monkeypatch.setenv("HASFL_SPARSE_CUDA_KERNEL", "serial")
    aggregate_updates(shapes, updates, weights, blocks, backend="fused")
    monkeypatch.setenv("HASFL_SPARSE_CUDA_KERNEL", "fast")
    with pytest.raises(ConfigError, match=WORDS[0]):
        aggregate_updates(shapes, updates, weights, blocks, backend="fused")
