"""The fourth battery, items 9 and 11 (issue 37): the tracebacks it found, each now one sentence with exit 2 and
nothing written (clock tiers that are not numbers, a trace client id like '²', model plug-ins on the meta device or
with lazy modules, report's NaN, negative and out-of-range numbers in run files), a finished cell whose summary.json
is not a finished run's, and the smaller notes (data inspect with a dataset plug-in and exact widths, `eval_widths:
full` in YAML, a deadline beyond float32, a FIFO as a plug-in file)."""

import csv
import json
import logging
import os
import shutil

import pytest
import yaml

from hasfl_ray.engine import Engine, RunConfig
from sentences import invoke, refused

TINY = ["--rounds", "1", "--clients", "4", "--clients-per-round", "2", "--backend", "local", "--quiet"]
EXAMPLES = os.path.join(os.path.dirname(__file__), "..", "..", "examples")


# ----------------------------------------------------------------------------------------------- the clock

TIER = {"width": 1.0, "speed": 1e9, "down": 1e6, "up": 1e6, "latency": 0.1}


@pytest.mark.parametrize("tiers, words", [
    ([{**TIER, "speed": "fast"}], ["devices.tiers speed is 'fast'", "a number within [1, 1e+21]"]),
    ([{**TIER, "width": None}], ["devices.tiers width is None", "a width in (0, 1]"]),
    ([{**TIER, "latency": "0.1"}], ["devices.tiers latency is '0.1'"]),
    ({"half": {k: v for k, v in TIER.items() if k != "width"}}, ["devices.tiers width is 'half'"]),
    ({1.0: 3e9}, ["devices.tiers entry", "speed"]),
    (7, ["devices.tiers is 7"]),
])
def test_tiers_that_are_not_numbers_are_one_sentence(tmp_path, monkeypatch, tiers, words):
    """A string or null among a tier's values was a TypeError traceback ('>' between str and int)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "c.yaml").write_text(yaml.safe_dump({"devices": {"tiers": tiers}}))
    refused(invoke("simulate", "--config", "c.yaml", *TINY, "--out", "run"), *words)
    assert sorted(os.listdir(".")) == ["c.yaml"]


@pytest.mark.parametrize("client", ["²", "١", "1_0", "x"])
def test_a_trace_client_id_that_is_not_ascii_digits_is_one_sentence(tmp_path, monkeypatch, client):
    """'²' passed str.isdigit() but not int(): a StopIteration traceback; '١' and '1_0' passed int() as 1 and 10."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "t.csv").write_text("client,speed_macs_per_s,down_bytes_per_s,up_bytes_per_s,latency_s\n"
                                    f"0,1e9,1e6,1e6,0.1\n{client},1e9,1e6,1e6,0.1\n")
    refused(invoke("simulate", "--devices", "t.csv", *TINY, "--out", "run"), f"has client {client!r}",
            "expected an integer client id")
    assert not os.path.exists("run")


@pytest.mark.parametrize("deadline", ["1e39", "1e300"])
def test_a_deadline_beyond_float32_names_the_bound(tmp_path, monkeypatch, deadline):
    monkeypatch.chdir(tmp_path)
    refused(invoke("simulate", "--devices", "lognormal", "--deadline", deadline, *TINY, "--out", "run"),
            "deadline is", "> 0 and at most 3.4e+38, float32's largest")
    (tmp_path / "c.yaml").write_text(f"devices: lognormal\ndeadline: {float(deadline)!r}\n")
    refused(invoke("simulate", "--config", "c.yaml", *TINY, "--out", "run"), "at most 3.4e+38")
    assert not os.path.exists("run")


# ------------------------------------------------------------------------------------------- model plug-ins

MODELS = '''
import math
import torch
from torch import nn


class MetaNet(nn.Module):
    def __init__(self, width=1.0, num_classes=10, in_features=64):
        super().__init__()
        self.fc1 = nn.Linear(in_features, math.ceil(width * 32), device="meta")
        self.fc2 = nn.Linear(math.ceil(width * 32), num_classes, device="meta")

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x.flatten(1))))


class LazyNet(nn.Module):
    def __init__(self, width=1.0, num_classes=10):
        super().__init__()
        self.fc1 = nn.LazyLinear(math.ceil(width * 32))
        self.fc2 = nn.Linear(math.ceil(width * 32), num_classes)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x.flatten(1))))
'''


@pytest.mark.parametrize("name, words", [("MetaNet", ["parameter 'fc1.weight' on the meta device"]),
                                         ("LazyNet", ["parameter 'fc1.weight' uninitialised (a lazy module)"])])
@pytest.mark.parametrize("command", ["simulate", "cost"])
def test_a_model_without_values_is_one_sentence_in_simulate_and_cost(tmp_path, monkeypatch, name, words, command):
    """Was a traceback: NotImplementedError (meta, simulate) and RuntimeError (lazy, simulate and cost); cost of
    the meta model printed a table of a network that cannot train."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "models.py").write_text(MODELS)
    args = [*TINY, "--out", "run"] if command == "simulate" else ["--dataset", "digits"]
    refused(invoke(command, "--model", f"models.py:{name}", *args), f"model 'models.py:{name}'", *words)
    assert sorted(os.listdir(".")) == ["models.py"]


@pytest.mark.parametrize("kind", ["algorithm", "dataset", "model"])
def test_a_fifo_as_a_plugin_file_gets_the_fifo_sentence(tmp_path, monkeypatch, kind):
    """Was "the file 'p.py' does not exist" (it does: a FIFO); importing it would block."""
    monkeypatch.chdir(tmp_path)
    os.mkfifo("p.py")
    refused(invoke("simulate", f"--{kind}", "p.py:X", *TINY, "--out", "run"), f"{kind} 'p.py:X'",
            "'p.py' is a FIFO; expected a regular file")
    assert sorted(os.listdir(".")) == ["p.py"]


# ---------------------------------------------------------------------------------------- run files, reports

@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    path = tmp_path_factory.mktemp("finished") / "digits-hasfl-seed42"
    Engine(RunConfig(backend="local", rounds=2, clients=6, clients_per_round=3), out_dir=str(path)).run()
    return path


def _summary(run, key, value):
    path = os.path.join(run, "summary.json")
    summary = json.load(open(path))
    summary[key] = value
    open(path, "w").write(json.dumps(summary))


def _clients(run, column, value):
    path = os.path.join(run, "clients.csv")
    rows = list(csv.DictReader(open(path)))
    rows[0][column] = value
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def _metrics(run, key, value):
    path = os.path.join(run, "metrics.jsonl")
    lines = [json.loads(line) for line in open(path) if line.strip()]
    lines[0][key] = value
    open(path, "w").write("".join(json.dumps(line) + "\n" for line in lines))


@pytest.mark.parametrize("tamper, words", [
    (lambda r: _clients(r, "p_max", "nan"), ["clients.csv' line 2 has p_max 'nan'", "in [0, 1]"]),  # LinAlgError
    (lambda r: _clients(r, "p_max", "inf"), ["has p_max 'inf'"]),
    (lambda r: _clients(r, "p_final", "-1"), ["has p_final '-1'"]),
    (lambda r: _clients(r, "tv_distance", "5"), ["has tv_distance '5'"]),
    (lambda r: _clients(r, "h_tilde", "nan"), ["has h_tilde 'nan'", "a finite number"]),
    (lambda r: _summary(r, "best_accuracy", float("nan")), ["summary.json' has best_accuracy nan"]),
    (lambda r: _summary(r, "final_accuracy", -0.5), ["has final_accuracy -0.5", "in [0, 1]"]),
    (lambda r: _summary(r, "avg_p", 3), ["has avg_p 3"]),
    (lambda r: _summary(r, "accuracy_at_width_final", {"0.5": 2}), ["accuracy_at_width_final entry '0.5': 2"]),
    (lambda r: _metrics(r, "test_accuracy", float("nan")), ["metrics.jsonl' line 1 has test_accuracy nan"]),
    (lambda r: _metrics(r, "test_loss", -1), ["line 1 has test_loss -1", ">= 0"]),
    (lambda r: _metrics(r, "avg_p", 7), ["line 1 has avg_p 7"]),
])
@pytest.mark.parametrize("command", ["report", "plot"])
def test_report_refuses_nan_negative_and_out_of_range_numbers(finished, tmp_path, monkeypatch, tamper, words,
                                                              command):
    monkeypatch.chdir(tmp_path)
    run = os.path.join("runs", "digits-hasfl-seed42")
    shutil.copytree(finished, run)
    tamper(run)
    refused(invoke(command, "runs", "--out", "out"), "run file", *words)
    assert not os.path.exists("out")


@pytest.mark.parametrize("summary, words", [
    ({"best_accuracy": "high"}, ["has best_accuracy 'high'"]),
    ({"avg_p": None}, ["has avg_p None"]),
    (None, ["has no best_accuracy"]),  # {}: no finished cell
])
def test_a_finished_cells_summary_that_is_not_a_runs_is_run_again(tmp_path, monkeypatch, caplog, summary, words):
    """A finished cell's summary.json with a text where a number goes was a ValueError traceback on every rerun
    (the status line formats it); {} was a finished cell."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "s.yaml").write_text(yaml.safe_dump({"sweep": {"algorithms": ["hasfl"], "seeds": [42]}, "rounds": 2,
                                                     "clients": 6, "clients_per_round": 3}))
    assert invoke("sweep", "s.yaml", "--backend", "local", "--quiet", "--out", "sw").exit_code == 0
    cell = os.path.join("sw", "digits-hasfl-seed42")
    kept = json.load(open(os.path.join(cell, "summary.json")))
    if summary is None:
        open(os.path.join(cell, "summary.json"), "w").write("{}")
    else:
        for key, value in summary.items():
            _summary(cell, key, value)
    with caplog.at_level(logging.WARNING):
        result = invoke("sweep", "s.yaml", "--backend", "local", "--out", "sw")
    assert result.exit_code == 0 and result.exception is None, result.output
    assert "resumed" in result.output and all(word in caplog.text for word in words), (result.output, caplog.text)
    assert json.load(open(os.path.join(cell, "summary.json")))["params_sha256"] == kept["params_sha256"]


# ------------------------------------------------------------------------------------------- smaller notes

def test_data_inspect_takes_a_dataset_plugin_and_prints_widths_exactly(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    spec = os.path.abspath(os.path.join(EXAMPLES, "my_dataset.py")) + ":MyDataset"
    result = invoke("data", "inspect", "--dataset", spec, "--clients", "4", "--json")
    assert result.exit_code == 0, result.output
    assert len(json.loads(result.stdout)["clients"]) == 4  # (the default tiers' note for 4 clients: on stderr)
    result = invoke("data", "inspect", "--clients", "12", "--widths", "1,0.5,0.25,0.125,0.0625")
    assert result.exit_code == 0, result.output
    shown = {line.split()[3] for line in result.output.splitlines()[2:]}
    assert {"0.125", "0.0625"} <= shown and not shown & {"0.12", "0.06"}, result.output
    refused(invoke("data", "inspect", "--dataset", "digitz"), "did you mean 'digits'")


def test_eval_widths_full_works_in_yaml_as_on_the_command_line(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "c.yaml").write_text("eval_widths: full\n")
    assert invoke("simulate", "--config", "c.yaml", *TINY, "--out", "yaml").exit_code == 0
    assert invoke("simulate", "--eval-widths", "full", *TINY, "--out", "flag").exit_code == 0
    for run in ("yaml", "flag"):
        assert yaml.safe_load(open(os.path.join(run, "config.yaml")))["eval_widths"] == [1.0]
    assert RunConfig(eval_widths="full").eval_widths == [1.0]
