"""The paper's default tiers (0.25/0.5/0.75/1 at 40/25/20/15 %, no widths or width_mix set) with few clients: their
largest-remainder rounding deals a tier no client (3 clients: 1/1/1/0, width 1 none) and nothing said so, where an
explicitly asked ladder got one warning line (tests/cli/test_bad_input_noted.py). Now the default tiers warn alike,
on every entry that deals them (simulate, its --config file, the sweep per cell, data inspect), naming the width, the
clients and the fewest clients that give every width one; the rounding itself (every run's result) is unchanged."""

import os

import pytest
import yaml

from hasfl_ray.config import RunConfig
from hasfl_ray.data.partition import tier_counts
from hasfl_ray.federation import PAPER_SHARES, empty_level_note, fewest_clients_filling
from sentences import invoke

LOCAL = ["--backend", "local", "--quiet"]


def note_of(**keys):
    return empty_level_note(RunConfig.from_dict({"clients_per_round": 1, **keys}))


def start_warnings(run):
    return [line for line in open(os.path.join(run, "log.txt")) if "by rounding" in line]


@pytest.mark.parametrize("clients, words", [
    (3, ["width 1 (share 15%) of the default tiers gets 0 of the 3 clients", "1/1/1/0", "--clients 5"]),
    (4, ["width 1 (share 15%)", "0 of the 4 clients", "2/1/1/0"]),
    (2, ["widths 0.75 (share 20%), 1 (share 15%) of the default tiers get 0 of the 2 clients", "1/1/0/0"]),
    (1, ["widths 0.5 (share 25%), 0.75 (share 20%), 1 (share 15%)", "0 of the 1 client by rounding"]),
])
def test_a_default_tier_dealt_no_client_is_named(clients, words):
    note = note_of(clients=clients)
    assert note is not None and len(note.split(". ")) == 1, note
    for word in words + ["clients per width 0.25/0.5/0.75/1", "--tier-counts"]:
        assert word in note, (word, note)
    assert "width_mix" not in note  # none was given: the remedy names what there is


@pytest.mark.parametrize("keys", [
    {"clients": 5}, {"clients": 6}, {"clients": 20},  # every tier a client
    {"clients": 3, "tier_counts": [1, 1, 1, 0]},  # exact counts, a 0 asked for
    {"clients": 3, "width_assignment": "dynamic"},  # redrawn every round
])
def test_no_note_where_every_default_tier_gets_a_client(keys):
    assert note_of(**keys) is None


def test_the_fewest_clients_named_fill_every_tier_and_the_rounding_is_unchanged():
    fewest = fewest_clients_filling(PAPER_SHARES)
    assert all(tier_counts(n).min() == 0 for n in range(1, fewest))
    assert all(tier_counts(n).min() >= 1 for n in range(fewest, 60))
    assert tier_counts(3).tolist() == [1, 1, 1, 0] and tier_counts(20).tolist() == [8, 5, 4, 3]


def test_simulate_and_its_config_file_say_it_at_the_start(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    tiny = ["--rounds", "1", "--clients-per-round", "2"]
    result = invoke("simulate", *LOCAL, *tiny, "--clients", "3", "--out", "flags")
    assert result.exit_code == 0, result.output
    (tmp_path / "three.yaml").write_text(yaml.safe_dump({"clients": 3, "clients_per_round": 2, "rounds": 1}))
    result = invoke("simulate", *LOCAL, "--config", "three.yaml", "--out", "file")
    assert result.exit_code == 0, result.output
    for run in ("flags", "file"):
        lines = start_warnings(run)
        assert len(lines) == 1 and "WARNING" in lines[0] and "width 1 (share 15%) of the default tiers" in lines[0]
    result = invoke("simulate", *LOCAL, *tiny, "--clients", "5", "--out", "five")
    assert result.exit_code == 0, result.output
    assert not start_warnings("five")


def test_a_sweep_says_it_per_cell_before_its_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "s.yaml").write_text(yaml.safe_dump({"sweep": {"algorithms": ["fedavg"], "seeds": [42]}, "rounds": 1,
                                                     "clients": 3, "clients_per_round": 2}))
    result = invoke("sweep", "s.yaml", *LOCAL, "--out", "sw")
    assert result.exit_code == 0, result.output
    lines = [line for line in result.output.splitlines() if "by rounding" in line]
    assert len(lines) == 1 and lines[0].startswith("warning: sweep cell digits-fedavg-seed42: width 1 (share 15%)")
    assert result.output.index("by rounding") < result.output.index("sweep s.yaml:")  # before any cell runs


def test_data_inspect_says_it_on_stderr():
    result = invoke("data", "inspect", "--dataset", "digits", "--clients", "3", "--json")
    assert result.exit_code == 0, result.output
    assert "warning: width 1 (share 15%) of the default tiers" in result.stderr
    assert "by rounding" not in result.stdout
