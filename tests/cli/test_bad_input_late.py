"""Bad input found late or dropped in silence (h66, RELIABILITY rows late-a..): a sweep list's repeated entry
(``--seeds 42,42`` ran one seed and reported a mean over one), a cell's data refused only as the cell started
(after the sweep's folder and other cells), and ``--client-batching`` on or mixed that trains one client at a
time under ``--precision bf16`` without a word."""

import os

import pytest
import yaml

from sentences import invoke, refused

LOCAL = ["--backend", "local", "--quiet"]
TINY = {"rounds": 1, "clients": 6, "clients_per_round": 3}


def write_sweep(path, block, **keys):
    path.write_text(yaml.safe_dump({"sweep": block, **TINY, **keys}))
    return str(path)


# ------------------------------------------------------------------------------ late-a: repeated list entries

@pytest.mark.parametrize("flag, value, words", [
    ("--seeds", "42,42", ["--seeds is '42,42'", "seed 42 twice", "expected distinct seeds"]),
    ("--seeds", "42 43 42", ["seed 42 twice", "expected distinct seeds"]),
    ("--algorithms", "fedavg,hasfl,fedavg", ["algorithm 'fedavg' twice", "expected distinct algorithms"]),
    ("--datasets", "digits,digits", ["dataset 'digits' twice", "expected distinct datasets"]),
])
def test_a_sweep_flag_giving_an_entry_twice_is_refused(tmp_path, monkeypatch, flag, value, words):
    """`sweep --seeds 42,42` ran one cell and reported a mean over one seed: now one sentence, no sweep folder."""
    monkeypatch.chdir(tmp_path)
    config = write_sweep(tmp_path / "s.yaml", {"algorithms": ["fedavg"]})
    refused(invoke("sweep", config, flag, value, *LOCAL, "--out", "sw"), *words)
    assert not os.path.exists("sw")


@pytest.mark.parametrize("block, words", [
    ({"seeds": [42, 43, 42]}, ["has seed 42 twice in sweep.seeds", "expected distinct seeds"]),
    ({"algorithms": ["fedavg", "fedavg"]}, ["algorithm 'fedavg' twice in sweep.algorithms"]),
])
def test_a_sweep_file_giving_an_entry_twice_is_refused_by_sweep_and_simulate(tmp_path, monkeypatch, block, words):
    """The YAML's lists say the same sentence as the flags, for `sweep` and for `simulate --config`."""
    monkeypatch.chdir(tmp_path)
    # the file by its name in the current folder: the sentence's length is then the program's, not the length of
    # the temporary folder's path (longer under pytest-xdist, popen-gwN/, or with a longer user name)
    config = os.path.basename(write_sweep(tmp_path / "s.yaml", block))
    refused(invoke("sweep", config, *LOCAL, "--out", "sw"), "s.yaml", *words)
    refused(invoke("simulate", "--config", config, *LOCAL, "--out", "run"), "s.yaml", *words)
    assert not os.path.exists("sw") and not os.path.exists("run")


@pytest.mark.parametrize("command", ["simulate", "sweep"])
def test_an_algorithm_option_given_twice_is_refused(tmp_path, monkeypatch, command):
    """`--algo-opt mu=0.1 --algo-opt mu=0.5` kept the last in silence (a config file refuses a key given twice)."""
    monkeypatch.chdir(tmp_path)
    where = ["--config", write_sweep(tmp_path / "s.yaml", {"algorithms": ["fedprox"]})] if command == "simulate" \
        else [write_sweep(tmp_path / "s.yaml", {"algorithms": ["fedprox"]})]
    refused(invoke(command, *where, "--algo-opt", "mu=0.1", "--algo-opt", "mu=0.5", *LOCAL, "--out", "out"),
            "--algo-opt gives 'mu' twice ('mu=0.1' and 'mu=0.5')", "expected each option once")
    assert not os.path.exists("out")


def test_a_tracker_given_twice_is_refused(tmp_path, monkeypatch):
    """`--track mlflow --track mlflow` made two trackers logging one run twice; refused before anything is made."""
    monkeypatch.chdir(tmp_path)
    refused(invoke("simulate", *LOCAL, "--rounds", "1", "--track", "mlflow", "--track", "mlflow", "--out", "run"),
            "track names 'mlflow' twice", "expected each tracker once")
    assert not os.path.exists("run")


def test_distinct_entries_still_run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    config = write_sweep(tmp_path / "s.yaml", {"algorithms": ["fedavg"]})
    result = invoke("sweep", config, "--seeds", "42,43", *LOCAL, "--out", "sw")
    assert result.exit_code == 0, result.output
    assert sorted(n for n in os.listdir("sw") if n.startswith("digits")) == ["digits-fedavg-seed42",
                                                                              "digits-fedavg-seed43"]


# ------------------------------------------------------------------ late-b: a cell's data, before anything runs

@pytest.mark.parametrize("keys, words", [
    ({"clients": 2000, "clients_per_round": 2, "partition": "iid"},
     ["cannot give each of 2000 clients one", "sweep cell digits-fedavg-seed42"]),
    ({"clients": 20, "clients_per_round": 2, "partition": "shards:500"},
     ["partition is 'shards:500' with 20 clients", "sweep cell digits-fedavg-seed42"]),
    ({"clients": 20, "clients_per_round": 2, "partition": "classes:11"},
     ["has 10 classes", "sweep cell digits-fedavg-seed42"]),
])
def test_a_sweep_refuses_a_cells_data_before_its_folder(tmp_path, monkeypatch, keys, words):
    """The data layer's refusals (a client count the samples cannot serve, more shards than samples, more classes
    than the labels) came from each cell as it started: the sweep folder made, other cells run, exit 1."""
    monkeypatch.chdir(tmp_path)
    config = write_sweep(tmp_path / "s.yaml", {"algorithms": ["fedavg"], "seeds": [42, 43]}, **keys)
    refused(invoke("sweep", config, *LOCAL, "--out", "sw"), *words)
    assert not os.path.exists("sw")


def test_the_second_dataset_of_a_sweep_is_checked_before_the_first_runs(tmp_path, monkeypatch, shared_data):
    """digits' 1438 training samples serve 600 clients, the CIFAR-10 sample's 500 do not: refused before the digits
    cell runs (it used to run, then the CIFAR-10 cell was refused and the sweep ended with status 1)."""
    monkeypatch.chdir(tmp_path)
    config = write_sweep(tmp_path / "s.yaml", {"datasets": ["digits", "cifar10"], "algorithms": ["fedavg"]},
                         clients=600, clients_per_round=2, partition="iid", local_eval_clients="off")
    data = os.path.join(shared_data, "torchvision")
    refused(invoke("sweep", config, *LOCAL, "--data-dir", data, "--out", "sw"),
            "500 samples cannot give each of 600 clients one", "sweep cell cifar10-fedavg-seed42")
    assert not os.path.exists("sw")


def test_missing_files_are_left_to_the_cell(tmp_path, monkeypatch):
    """A data folder missing here may be on a Ray cluster's nodes: the check leaves a DataError to the cell, which
    says it as it starts (as before)."""
    monkeypatch.chdir(tmp_path)
    config = write_sweep(tmp_path / "s.yaml", {"datasets": ["cifar10"], "algorithms": ["fedavg"]})
    result = invoke("sweep", config, *LOCAL, "--data-dir", str(tmp_path / "none"), "--out", "sw")
    assert result.exit_code == 1 and "cifar" in result.output.lower(), result.output
    assert os.path.isfile(os.path.join("sw", "sweep.json"))


# ------------------------------------------------------------------ late-c: batching asked for, not done

@pytest.mark.parametrize("flags, words", [
    (["--precision", "bf16", "--client-batching", "mixed"], ["client_batching is 'mixed'", "precision is 'bf16'"]),
    (["--precision", "bf16", "--client-batching", "on"], ["client_batching is 'on'", "precision is 'bf16'"]),
    (["--local-optimizer", "adam", "--client-batching", "on"], ["client_batching is 'on'", "local_optimizer"]),
    (["--client-batching", "on"], None),
    (["--precision", "bf16"], None),
])
def test_batching_that_is_not_done_is_said_at_the_start(tmp_path, monkeypatch, flags, words):
    """bf16 (and a torch.optim local optimiser) trains every client one at a time whatever --client-batching says:
    one warning line at the start names both options and what happens instead."""
    monkeypatch.chdir(tmp_path)
    result = invoke("simulate", *LOCAL, "--rounds", "1", "--clients", "6", "--clients-per-round", "3", *flags,
                    "--out", "run")
    assert result.exit_code == 0, result.output
    lines = [line for line in open(os.path.join("run", "log.txt")) if "client_batching is" in line]
    if words is None:
        assert not lines, lines
        return
    assert len(lines) == 1 and "WARNING" in lines[0], lines
    for word in words + ["one at a time", "--client-batching off"]:
        assert word in lines[0], (word, lines[0])
