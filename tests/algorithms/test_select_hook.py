"""The client-selection hook (``Algorithm.select(round, available, k)``, docs/plugins.md "Client selection"): the
default is the seeded uniform draw every run has always had; a plug-in's choice is who trains each round (and who
clients.csv counts as sampled), on the local backend as after a resume; what it returns is checked (one sentence)."""

import json
import textwrap

import pytest
from click.testing import CliRunner

from hasfl_ray.cli.main import main
from hasfl_ray.engine import Engine, RunConfig
from hasfl_ray.engine.guard import GuardedAlgorithm
from hasfl_ray.engine.participants import sample_participants

EXAMPLE = "examples/round_robin_selection.py:RoundRobin"
SMALL = dict(backend="local", rounds=3, clients=8, clients_per_round=3, local_epochs=1, seed=5, checkpoint_every=1,
             warmup=1, t_adapt=1)


def record_participants(monkeypatch):
    seen = []
    original = GuardedAlgorithm.allocate

    def allocate(self, round, participants):
        seen.append(list(participants))
        return original(self, round, participants)

    monkeypatch.setattr(GuardedAlgorithm, "allocate", allocate)
    return seen


def test_the_default_select_is_the_seeded_draw(monkeypatch, tmp_path):
    seen = record_participants(monkeypatch)
    Engine(RunConfig(**SMALL), out_dir=str(tmp_path / "run")).run()
    assert seen == [sample_participants(5, t, 8, 3) for t in range(3)]


def test_a_plugins_select_chooses_who_trains_and_who_counts_as_sampled(monkeypatch, tmp_path):
    seen = record_participants(monkeypatch)
    engine = Engine(RunConfig(**{**SMALL, "rounds": 2}, algorithm=EXAMPLE), out_dir=str(tmp_path / "run"))
    summary = engine.run()
    assert seen == [[0, 1, 2], [3, 4, 5]]
    # the clients counted as sampled (clients.csv's tv_distance is over them) are the ones select chose
    assert engine.sampled_clients().tolist() == [True] * 6 + [False] * 2
    default = Engine(RunConfig(**{**SMALL, "rounds": 2}), out_dir=str(tmp_path / "default")).run()
    assert summary["params_sha256"] != default["params_sha256"]


def test_a_resumed_run_with_a_plugin_select_matches(tmp_path):
    flags = ["simulate", "--backend", "local", "--rounds", "4", "--clients", "8", "--clients-per-round", "3",
             "--checkpoint-every", "1", "--quiet", "--algorithm", EXAMPLE]
    whole = CliRunner().invoke(main, flags + ["--out", str(tmp_path / "whole")])
    assert whole.exit_code == 0, whole.output
    crashed = CliRunner().invoke(main, flags + ["--fault-inject", "trainer-error@2", "--out", str(tmp_path / "run")])
    assert crashed.exit_code == 1, crashed.output
    resumed = CliRunner().invoke(main, ["simulate", "--out", str(tmp_path / "run"), "--resume", "--quiet"])
    assert resumed.exit_code == 0, resumed.output
    read = [json.loads((tmp_path / d / "summary.json").read_text())["params_sha256"] for d in ("whole", "run")]
    assert read[0] == read[1]
    assert (tmp_path / "whole" / "clients.csv").read_text() == (tmp_path / "run" / "clients.csv").read_text()


@pytest.mark.parametrize("body, words", [
    ("return []", "1 to 3 distinct client ids of the 8 available"),
    ("return [0, 0, 1]", "1 to 3 distinct client ids"),
    ("return [0, 1, 2, 3]", "1 to 3 distinct client ids"),
    ("return [0, 99]", "of the 8 available"),
    ("return ['a']", "1 to 3 distinct client ids"),
    ("return None", "a list of client ids"),
    ("raise RuntimeError('no')", "raised RuntimeError in select()"),
])
def test_a_bad_selection_is_one_sentence(tmp_path, body, words):
    path = tmp_path / "plugin.py"
    path.write_text("from hasfl_ray.algorithms.base import Algorithm\n\nclass Bad(Algorithm):\n"
                    "    def select(self, round, available, k):\n" + textwrap.indent(body, "        ") + "\n")
    result = CliRunner().invoke(main, ["simulate", "--backend", "local", "--rounds", "2", "--clients", "8",
                                       "--clients-per-round", "3", "--quiet", "--algorithm", f"{path}:Bad", "--out",
                                       str(tmp_path / "run")])
    message = result.output.strip()
    assert result.exit_code in (1, 2) and "Traceback" not in message and len(message.splitlines()) == 1, message
    assert "'Bad'" in message and words in message, message
