"""Battery 5's smaller rows (issue 49 item 6): a model plug-in whose w^(0) holds a NaN, a sweep's control-variates
folder inside its own output, a Ray cluster that answers but refuses us, options accepted that do nothing, and the
sentences that named the wrong thing. Each ends in one sentence and exit status 2 before anything is made."""

import os

import pytest

from sentences import invoke, refused

TINY = ["--backend", "local", "--rounds", "2", "--clients", "6", "--clients-per-round", "3", "--quiet"]

NAN_MODEL = '''
import math
import torch
from torch import nn


class NanInit(nn.Module):
    def __init__(self, width=1.0, num_classes=10, in_features=64, bad=float("nan")):
        super().__init__()
        self.fc1 = nn.Linear(in_features, math.ceil(width * 16))
        self.fc2 = nn.Linear(math.ceil(width * 16), num_classes)
        with torch.no_grad():
            self.fc1.weight[0, 0] = bad

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x.flatten(1))))


class InfInit(NanInit):
    def __init__(self, width=1.0, num_classes=10):
        super().__init__(width, num_classes, bad=float("inf"))
'''


@pytest.mark.parametrize("name, value", [("NanInit", "nan"), ("InfInit", "inf")])
@pytest.mark.parametrize("command", ["simulate", "cost"])
def test_a_model_plugin_with_a_nan_in_its_initial_weights_is_refused(tmp_path, monkeypatch, name, value, command):
    """Battery 5's problem 4: every update of every round was rejected and the run ended rc 0 with local
    accuracy 100 % (a NaN beat nothing); now one sentence before anything is made."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "models.py").write_text(NAN_MODEL)
    args = ["simulate", *TINY, "--out", "run"] if command == "simulate" else ["cost", "--dataset", "digits"]
    refused(invoke(*args, "--model", f"models.py:{name}"), f"model 'models.py:{name}'", "'fc1.weight'",
            f"holding {value}", "expected finite")
    assert sorted(os.listdir(".")) == ["models.py"]


# ------------------------------------------------------------------ problem 15: a sweep's cv folder in its run dirs

@pytest.mark.parametrize("cv", ["scx", "./scx/", "scx/digits-scaffold-seed43", "scx/digits-scaffold-seed42/sub"])
def test_a_sweeps_control_variates_dir_in_a_cells_run_directory_is_refused_before_any_cell(tmp_path, monkeypatch,
                                                                                           cv):
    """Battery 5's problem 15 (battery 4's row 21 for the sweep): --control-variates-dir equal to the sweep's --out
    started every cell, each failed, exit 1, and the advised rerun failed the same way; now one sentence naming the
    run directory before any cell starts (nothing made)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "s.yaml").write_text("sweep:\n  algorithms: [scaffold]\n  seeds: [42, 43]\n"
                                     "rounds: 2\nclients: 6\nclients_per_round: 3\n")
    refused(invoke("sweep", "s.yaml", "--backend", "local", "--quiet", "--out", "scx",
                   "--control-variates-dir", cv), "control_variates_dir", "run directory 'scx/digits-scaffold-seed4",
            "expected a folder outside every cell's run directory")
    assert sorted(os.listdir(".")) == ["s.yaml"]


# ----------------------------------------------------------------- problem 17: --global-width first without levels

@pytest.mark.parametrize("extra, shown", [([], "unset"), (["--width-mix", "1,1"], "'1,1'")])
def test_global_width_first_without_a_width_ladder_is_refused(tmp_path, monkeypatch, extra, shown):
    """Battery 5's problem 17: without --width-mix, `first` was taken as 1 (config.yaml global_width: 1.0), though
    docs/models.md says `first` without HeteroFL's notation is refused in one sentence."""
    monkeypatch.chdir(tmp_path)
    refused(invoke("simulate", *TINY, "--model", "preresnet18", "--global-width", "first", *extra, "--out", "run"),
            f"global_width is 'first' but width_mix is {shown}", "HeteroFL's notation")
    assert os.listdir(".") == []


# ------------------------------------------------- problem 18 and the sBN keys: statistics that cannot apply

@pytest.mark.parametrize("args, words", [
    (["--eval-samples", "101", "--eval-batch-size", "100"], ["101 test samples in batches of 100"]),
    (["--eval-batch-size", "1"], ["in batches of 1 leave a batch of one"]),
])
def test_test_batch_statistics_with_a_batch_of_one_sample_are_refused_before_the_run(tmp_path, monkeypatch, args,
                                                                                      words):
    """Battery 5's problem 18: FedRolex's test-batch statistics with a last test batch of one sample failed at the
    first evaluation, after training, exit 1, with no checkpoint; the size is known before the run starts."""
    monkeypatch.chdir(tmp_path)
    refused(invoke("simulate", *TINY, "--model", "preresnet18", "--sbn-statistics", "test-batch", *args, "--out",
                   "run"), "sbn_statistics is 'test_batch'", *words, "expected another --eval-batch-size")
    assert os.listdir(".") == []


@pytest.mark.parametrize("args, words", [
    (["--sbn-statistics", "test-batch"], ["sbn_statistics is 'test_batch'", "model 'digits'"]),
    (["--sbn-batch-size", "20"], ["sbn_batch_size is 20"]),
    (["--model", "preresnet18", "--model-norm", "gn", "--sbn-statistics", "in-order"],
     ["sbn_statistics is 'in_order'"]),
])
def test_sbn_keys_on_a_model_without_sbn_are_refused(tmp_path, monkeypatch, args, words):
    """Battery 5's smaller notes (A155, A236): sbn_statistics and sbn_batch_size on a model without static BatchNorm
    were accepted and did nothing."""
    monkeypatch.chdir(tmp_path)
    refused(invoke("simulate", *TINY, *args, "--out", "run"), *words, "no static BatchNorm", "does nothing")
    assert os.listdir(".") == []


def test_a_batch_that_is_not_one_sample_and_the_default_sbn_keys_still_run(tmp_path, monkeypatch):
    """The refusals above leave what applies alone: test-batch statistics whose last batch holds two samples, and
    the sBN keys at their defaults on a model without sBN."""
    monkeypatch.chdir(tmp_path)
    result = invoke("simulate", *TINY, "--rounds", "1", "--model", "preresnet18", "--sbn-statistics", "test-batch",
                    "--eval-samples", "102", "--eval-batch-size", "100", "--out", "run")
    assert result.exit_code == 0, result.output
    result = invoke("simulate", *TINY, "--rounds", "1", "--sbn-statistics", "shuffled", "--sbn-batch-size", "10",
                    "--out", "plain")
    assert result.exit_code == 0, result.output


# ---------------------------------------------------- smaller notes: keys accepted that did nothing

@pytest.mark.parametrize("args, words", [
    (["--lr-gamma", "0.5"], ["lr_gamma is 0.5", "lr_milestones is unset", "does nothing"]),
    (["--local-epochs", "2", "--local-steps", "3"], ["local_epochs is 2 beside local_steps 3", "does nothing"]),
])
def test_keys_that_do_nothing_are_refused_in_simulate(tmp_path, monkeypatch, args, words):
    """Battery 5's smaller notes (A146, A237): --lr-gamma without --lr-milestones and --local-epochs beside
    --local-steps were accepted and did nothing."""
    monkeypatch.chdir(tmp_path)
    refused(invoke("simulate", *TINY, *args, "--out", "run"), *words)
    (tmp_path / "c.yaml").write_text("local_steps: 3\n")  # a config file's key and a flag's meet the same way
    refused(invoke("simulate", *TINY, "--config", "c.yaml", "--local-epochs", "2", "--out", "run"),
            "local_epochs is 2 beside local_steps 3")
    assert sorted(os.listdir(".")) == ["c.yaml"]


@pytest.mark.parametrize("yaml_text, args, words", [
    ("sweep:\n  algorithms: [fast]\n  variants:\n    fast: {algorithm: fedavg, local_epochs: 2}\nlocal_steps: 3\n",
     [], ["local_epochs is 2 beside local_steps 3 (sweep cell digits-fast-seed42)"]),
    ("sweep:\n  algorithms: [fedavg]\nlocal_steps: 3\n", ["--local-epochs", "1"], ["local_epochs is 1 beside"]),
    ("sweep:\n  algorithms: [fedavg]\nlr_gamma: 0.5\n", [], ["lr_gamma is 0.5 but lr_milestones is unset (sweep cell"]),
])
def test_keys_that_do_nothing_are_refused_in_a_sweep(tmp_path, monkeypatch, yaml_text, args, words):
    """The same in a sweep (A261: a variant's local_epochs beside the shared local_steps), before any cell starts."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "s.yaml").write_text(yaml_text + "rounds: 1\nclients: 6\nclients_per_round: 3\n")
    refused(invoke("sweep", "s.yaml", "--backend", "local", "--quiet", "--seeds", "42", *args, "--out", "sw"), *words)
    assert sorted(os.listdir(".")) == ["s.yaml"]


def test_the_keys_with_what_they_act_on_and_a_resumed_runs_own_keys_still_run(tmp_path, monkeypatch):
    """What applies is untouched: lr_gamma with milestones, local_steps alone, and a --resume whose stored config
    holds the resolved local_epochs beside local_steps (and the default lr_gamma without milestones), that
    config.yaml given as --config, and the Python API given a RunConfig."""
    monkeypatch.chdir(tmp_path)
    result = invoke("simulate", *TINY, "--lr-milestones", "1", "--lr-gamma", "0.5", "--out", "a")
    assert result.exit_code == 0, result.output
    result = invoke("simulate", *TINY, "--local-steps", "2", "--out", "b")
    assert result.exit_code == 0, result.output
    result = invoke("simulate", "--out", "b", "--resume", "--rounds", "3", "--force", "--quiet")
    assert result.exit_code == 0, result.output
    result = invoke("simulate", "--config", "b/config.yaml", "--out", "c", "--quiet")  # a run's config.yaml as a file
    assert result.exit_code == 0, result.output
    from hasfl_ray.api import simulate
    from hasfl_ray.config import RunConfig
    from hasfl_ray.errors import ConfigError
    simulate(RunConfig(backend="local", rounds=1, clients=6, clients_per_round=3, local_steps=2), out_dir="d",
             progress=False)  # a RunConfig holds every default (lr_gamma 0.1): none of them given by the user
    with pytest.raises(ConfigError, match="lr_gamma is 0.5 but lr_milestones is unset"):
        simulate({"backend": "local", "lr_gamma": 0.5}, out_dir="e", progress=False)
    assert sorted(os.listdir(".")) == ["a", "b", "c", "d"]


# ------------------------------------------------------------------ smaller notes: help texts and sentences

@pytest.mark.parametrize("command", [["simulate"], ["sweep"], ["data", "inspect"]])
def test_every_partition_scheme_is_in_each_commands_help(command):
    """Battery 5's smaller notes: simulate --help and sweep --help listed --partition without classes-even:K and
    balanced-dirichlet, data inspect --help without balanced-dirichlet; one help text now serves all three."""
    from click.testing import CliRunner

    from hasfl_ray.cli.main import main
    from hasfl_ray.federation import PARTITION_SCHEMES

    result = CliRunner(env={"COLUMNS": "400"}).invoke(main, [*command, "--help"], terminal_width=400)
    assert result.exit_code == 0, result.output
    line = next(line for line in result.output.splitlines() if "--partition" in line)
    for scheme in PARTITION_SCHEMES:
        assert scheme in line, (scheme, line)


def test_a_fifo_as_the_control_variates_dir_is_named_a_fifo(tmp_path, monkeypatch):
    """Battery 5's smaller notes (A189): a FIFO as --control-variates-dir was "not a folder (a device or socket)"."""
    monkeypatch.chdir(tmp_path)
    os.mkfifo("cv")
    refused(invoke("simulate", *TINY, "--algorithm", "scaffold", "--control-variates-dir", "cv", "--out", "run"),
            "control_variates_dir 'cv' is a FIFO; expected a folder")
    refused(invoke("simulate", *TINY, "--out", "cv"), "run directory 'cv' is a FIFO")
    assert os.listdir(".") == ["cv"]


def test_a_trace_field_over_the_csv_limit_is_named_as_such(tmp_path, monkeypatch):
    """Battery 5's smaller notes (A230): a trace whose availability field is over the CSV reader's 131,072
    characters was "not a CSV file"; it is one, with a field too long: the sentence names the limit and the line."""
    import csv

    monkeypatch.chdir(tmp_path)
    limit = csv.field_size_limit()
    long = " ".join(f"{2 * k}-{2 * k + 1}" for k in range(limit // 8))
    assert len(long) > limit
    rows = [f"{i},1e9,1e6,1e6,0.01,{long if i == 3 else '0-1'}" for i in range(6)]
    (tmp_path / "t.csv").write_text("client,speed_macs_per_s,down_bytes_per_s,up_bytes_per_s,latency_s,availability\n"
                                    + "\n".join(rows) + "\n")
    refused(invoke("simulate", *TINY, "--devices", "t.csv", "--out", "run"),
            f"device trace 't.csv' has a field longer than {limit:,} characters on line 5")
    assert sorted(os.listdir(".")) == ["t.csv"]
