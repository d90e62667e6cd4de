"""Defects noted by the last session and left (h68, RELIABILITY rows noted-a..): a width of the ladder asked for that
largest-remainder rounding deals no client was dropped in silence, and a sweep's data check skipped plug-in and
``hf:`` datasets, so their refusals came from each cell as it started (after the sweep's folder and other cells);
an ``hf:`` name not in the hub cache tried the network (5 retries) before it was refused."""

import os
import socket
import textwrap

import pytest
import yaml

from hasfl_ray.config import RunConfig
from hasfl_ray.data.partition import tier_counts
from hasfl_ray.federation import empty_level_note
from sentences import invoke, refused

LOCAL = ["--backend", "local", "--quiet"]
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MY_DATASET = os.path.join(REPO, "examples", "my_dataset.py") + ":MyDataset"


def write_sweep(path, block, **keys):
    path.write_text(yaml.safe_dump({"sweep": block, "rounds": 1, "clients": 6, "clients_per_round": 3, **keys}))
    return str(path)


def start_warnings(run):
    return [line for line in open(os.path.join(run, "log.txt")) if "by rounding" in line]


# ------------------------------------------------------------------ noted-a: a ladder level dealt no client

@pytest.mark.parametrize("keys, words", [
    ({"clients": 4, "width_mix": "a1-b1-c1-d1-e1"},
     ["width 0.0625 (share 20%)", "0 of the 4 clients", "1/1/1/1/0", "--tier-counts", "in place of width_mix"]),
    ({"clients": 8, "widths": [1.0, 0.5, 0.25, 0.125], "width_mix": [5, 10, 25, 60]},  # league l4-5.10.25.60
     ["width 1 (share 5%)", "0 of the 8 clients", "0/1/2/5"]),
    ({"clients": 3, "width_mix": [1, 1, 1, 1]}, ["width 1 (share 25%)", "0 of the 3 clients"]),
])
def test_a_level_rounding_deals_no_client_is_named(keys, words):
    note = empty_level_note(RunConfig.from_dict({"clients_per_round": 2, **keys}))
    assert note is not None and len(note.split(". ")) == 1, note
    for word in words:
        assert word in note, (word, note)


@pytest.mark.parametrize("keys", [
    {"clients": 5, "width_mix": "a1-b1-c1-d1-e1"},  # every level a client
    {"clients": 4, "widths": [1, 0.5, 0.25, 0.125, 0.0625], "tier_counts": [1, 1, 1, 1, 0]},  # exact, 0 asked for
    {"clients": 4, "width_mix": "a1-b1-c1-d1-e1", "width_assignment": "dynamic"},  # redrawn every round
    {"clients": 4, "width_mix": [1, 1, 1, 0]},  # a share of 0 gets 0
    {"clients": 5},  # the paper's tiers by default, each a client (fewer: tests/cli/test_default_tiers_noted.py)
])
def test_no_note_where_every_level_asked_for_gets_a_client(keys):
    assert empty_level_note(RunConfig.from_dict({"clients_per_round": 2, **keys})) is None


def test_the_rounding_itself_is_unchanged():
    """Only a note: the counts (and so every run's params_sha256) stay the largest remainder's."""
    assert tier_counts(20).tolist() == [8, 5, 4, 3]
    assert tier_counts(4, [0.2] * 5).tolist() == [1, 1, 1, 1, 0]
    assert tier_counts(8, [0.05, 0.1, 0.25, 0.6]).tolist() == [0, 1, 2, 5]


def test_a_run_says_it_at_its_start_and_tier_counts_silences_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    ladder = ["--widths", "1,0.5,0.25,0.125,0.0625", "--clients", "4", "--clients-per-round", "2", "--rounds", "1"]
    result = invoke("simulate", *LOCAL, *ladder, "--width-mix", "1,1,1,1,1", "--out", "run")
    assert result.exit_code == 0, result.output
    lines = start_warnings("run")
    assert len(lines) == 1 and "WARNING" in lines[0] and "width 0.0625 (share 20%)" in lines[0], lines
    result = invoke("simulate", *LOCAL, *ladder, "--tier-counts", "1,1,1,1,0", "--out", "exact")
    assert result.exit_code == 0, result.output
    assert not start_warnings("exact")


def test_a_sweep_says_it_per_cell_before_its_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    config = write_sweep(tmp_path / "s.yaml", {"algorithms": ["fedavg"], "seeds": [42, 43]}, clients=4,
                         clients_per_round=2, width_mix="a1-b1-c1-d1-e1")
    result = invoke("sweep", config, *LOCAL, "--out", "sw")
    assert result.exit_code == 0, result.output
    lines = [line for line in result.output.splitlines() if "by rounding" in line]
    assert len(lines) == 1 and lines[0].startswith("warning: sweep cells digits-fedavg-seed42, digits-fedavg-seed43:")
    assert result.output.index("by rounding") < result.output.index(f"sweep {config}:")  # before any cell runs


def test_the_league_configs_scaled_to_8_clients_name_their_empty_levels():
    """configs/league-cifar10.yaml's own try command (--clients 8): the l4-5.10.25.60 ladder deals width 1 no
    client, which the sweep now says; the ladders that give each level a client say nothing."""
    from hasfl_ray.sweep import plan_sweep
    from hasfl_ray.sweep.data_check import ladder_notes

    plan = plan_sweep(os.path.join(REPO, "configs", "league-cifar10.yaml"), {"clients": 8, "clients_per_round": 4},
                      None, None, [42], "/nonexistent/league")
    notes = ladder_notes(plan)
    named = " ".join(notes)
    assert notes and "5.10.25.60" in named and "10.20.30.40" not in named, notes


# ------------------------------------------------------------------ noted-b: plug-in and hf: data, before the folder

def test_a_plugin_dataset_that_cannot_serve_the_clients_is_refused_before_the_folder(tmp_path, monkeypatch):
    """examples/my_dataset.py's 288 training rows for 290 clients: each cell was refused as it started, the sweep
    folder made, exit 1."""
    monkeypatch.chdir(tmp_path)
    config = write_sweep(tmp_path / "s.yaml", {"datasets": [MY_DATASET], "algorithms": ["fedavg", "hasfl"]},
                         clients=290, clients_per_round=2)
    refused(invoke("sweep", config, *LOCAL, "--out", "sw"), "288 samples cannot give each of 290 clients one",
            "sweep cell MyDataset-fedavg-seed42")
    assert not os.path.exists("sw")


def plugin(tmp_path, load):
    path = tmp_path / "plug_data.py"
    path.write_text("import torch\nfrom hasfl_ray import Dataset, TensorFederatedDataset\n\n\nclass Data(Dataset):\n"
                    "    model = 'digits'\n    defaults = dict(local_epochs=1, lr=0.05, batch_size=4, clip_norm=10.0)\n\n"
                    "    def load(self, config):\n" + textwrap.indent(load, "        "))
    return f"{path}:Data"


def test_a_plugin_splitting_over_other_clients_is_refused_before_the_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    spec = plugin(tmp_path, "x, y = torch.zeros(12, 1, 8, 8), torch.arange(12) % 10\n"
                            "return TensorFederatedDataset('p', self.model, 10, x, y, x, y, [torch.arange(6), "
                            "torch.arange(6, 12)])\n")
    config = write_sweep(tmp_path / "s.yaml", {"datasets": [spec], "algorithms": ["fedavg"]})
    refused(invoke("sweep", config, *LOCAL, "--out", "sw"), "loaded 2 clients but clients is 6",
            "sweep cell Data-fedavg-seed42")
    assert not os.path.exists("sw")


def test_a_plugins_own_failure_stays_the_cells_error(tmp_path, monkeypatch):
    """A plug-in's code failing (it may need what only the cell's machine has) is left to the cell, as before."""
    monkeypatch.chdir(tmp_path)
    config = write_sweep(tmp_path / "s.yaml", {"datasets": [plugin(tmp_path, "raise RuntimeError('no server')\n")],
                                               "algorithms": ["fedavg"]})
    result = invoke("sweep", config, *LOCAL, "--out", "sw")
    assert result.exit_code == 1 and "no server" in result.output, result.output
    assert os.path.isfile(os.path.join("sw", "sweep.json"))


@pytest.fixture
def hub():
    pytest.importorskip("datasets", reason="the hub extra (datasets) is not installed: pip install '.[hub]'")
    pytest.importorskip("flwr_datasets", reason="the hub extra (flwr-datasets) is not installed: pip install '.[hub]'")


def test_an_hf_folder_that_cannot_serve_the_clients_is_refused_before_the_folder(hub, tmp_path, monkeypatch):
    from data.hub_files import write_image_dataset

    monkeypatch.chdir(tmp_path)
    saved = write_image_dataset(tmp_path / "ds")  # 192 training rows
    config = write_sweep(tmp_path / "s.yaml", {"datasets": ["digits", f"hf:{saved}?image=img&label=y"],
                                               "algorithms": ["fedavg"]}, clients=300, clients_per_round=2,
                         partition="iid")
    refused(invoke("sweep", config, *LOCAL, "--out", "sw"), "cannot give each of 300 clients one", "sweep cell ds-")
    assert not os.path.exists("sw")


def test_an_hf_name_not_in_the_cache_is_refused_before_the_folder_without_the_network(hub, tmp_path, monkeypatch):
    """The digits cell ran, then the hf: cell was refused (exit 1); and reading the cache tried huggingface.co 5
    times (about 30 s) first, as HF_DATASETS_OFFLINE set after `import datasets` is not read."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "empty-cache"))
    looked_up = []
    real = socket.getaddrinfo
    monkeypatch.setattr(socket, "getaddrinfo", lambda host, *a, **k: looked_up.append(host) or real(host, *a, **k))
    config = write_sweep(tmp_path / "s.yaml", {"datasets": ["digits", "hf:nobody/none"],
                                               "algorithms": ["fedavg"]})
    refused(invoke("sweep", config, *LOCAL, "--out", "sw"), "neither a folder nor a dataset in the hub cache",
            "sweep cell")
    assert not os.path.exists("sw")
    assert not looked_up, looked_up


def test_on_a_cluster_an_hf_name_missing_here_is_left_to_its_cell(hub, tmp_path, monkeypatch):
    """With --address the cells run on the cluster's nodes, whose cache may hold it: not refused here."""
    from hasfl_ray.sweep import plan_sweep
    from hasfl_ray.sweep.data_check import check_cell_data

    monkeypatch.setenv("HF_HOME", str(tmp_path / "empty-cache"))
    config = write_sweep(tmp_path / "s.yaml", {"datasets": ["hf:nobody/none"], "algorithms": ["fedavg"]})
    plan = plan_sweep(config, {}, None, None, None, str(tmp_path / "sw"))
    check_cell_data(plan, cluster=True)
    with pytest.raises(Exception, match="hub cache"):
        check_cell_data(plan, cluster=False)


def test_reading_the_hub_cache_never_tries_the_network(hub, tmp_path, monkeypatch):
    """`data inspect` (and a run) of an hf: name not cached: refused at once, no host looked up (it tried
    huggingface.co 5 times first)."""
    monkeypatch.setenv("HF_HOME", str(tmp_path / "empty-cache"))
    looked_up = []
    real = socket.getaddrinfo
    monkeypatch.setattr(socket, "getaddrinfo", lambda host, *a, **k: looked_up.append(host) or real(host, *a, **k))
    refused(invoke("data", "inspect", "--dataset", "hf:nobody/none"), "neither a folder nor a dataset in the hub cache",
            "nothing is downloaded")
    assert not looked_up, looked_up


def test_an_hf_dataset_gets_one_folder_under_runs_and_a_sweep_cell(hub, tmp_path, monkeypatch):
    """hf:/abs/path/ds made the default run directory /abs/path/ds?image=...-fedavg-... (outside runs/), and a
    sweep of any hf: path or owner/name was refused for its cell name's '/'."""
    from data.hub_files import write_image_dataset

    monkeypatch.chdir(tmp_path)
    spec = f"hf:{write_image_dataset(tmp_path / 'data' / 'ds')}?image=img&label=y"
    result = invoke("simulate", *LOCAL, "--dataset", spec, "--algorithm", "fedavg", "--rounds", "1", "--clients", "4",
                    "--clients-per-round", "2")
    assert result.exit_code == 0, result.output
    assert [n for n in os.listdir("runs") if n != "latest"][0].startswith("ds-fedavg-s42-")
    assert os.listdir(tmp_path / "data") == ["ds"]
    config = write_sweep(tmp_path / "s.yaml", {"datasets": [spec], "algorithms": ["fedavg"]}, clients=4,
                         clients_per_round=2)
    result = invoke("sweep", config, *LOCAL, "--out", "sw")
    assert result.exit_code == 0, result.output
    assert os.path.isfile(os.path.join("sw", "ds-fedavg-seed42", "summary.json"))


def test_data_inspect_warns_of_a_level_dealt_no_client_on_stderr():
    from click.testing import CliRunner

    from hasfl_ray.cli.main import main

    result = CliRunner().invoke(main, ["data", "inspect", "--dataset", "digits", "--clients", "8",
                                      "--widths", "1,0.5,0.25,0.125", "--width-mix", "5,10,25,60",
                                      "--json"])
    assert result.exit_code == 0, result.output
    assert "warning: width 1 (share 5%)" in result.stderr and "by rounding" not in result.stdout
