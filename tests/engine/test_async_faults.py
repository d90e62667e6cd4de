"""Fault injection in the asynchronous mode (docs/async.md#faults): ``--fault-inject KIND@N`` strikes dispatch N (a
poisoned update is rejected when it arrives; a trainer's error ends the run in one sentence naming the client and its
dispatch), and the synchronous keys an asynchronous run cannot take are refused in one sentence, never ignored."""

import json
import os

import pytest
from click.testing import CliRunner

from hasfl_ray.cli.main import main
from hasfl_ray.engine import Engine, RunConfig
from hasfl_ray.errors import ConfigError

ASYNC = dict(backend="local", mode="async", devices="lognormal", clients=10, clients_per_round=4, local_epochs=1,
             seed=5, concurrency=4, buffer_size=2, rounds=4, checkpoint_every=0)
FLAGS = ["simulate", "--mode", "async", "--devices", "lognormal", "--clients", "10", "--concurrency", "4",
         "--buffer-size", "2", "--rounds", "4", "--local-epochs", "1", "--seed", "5", "--backend", "local", "--quiet"]


def run(tmp_path, name, **values):
    out = tmp_path / name
    summary = Engine(RunConfig(**{**ASYNC, **values}), out_dir=str(out)).run()
    with open(out / "metrics.jsonl", encoding="utf-8") as handle:
        return summary, [json.loads(line) for line in handle]


@pytest.mark.parametrize("kind", ["nan-update", "inf-update"])
def test_a_poisoned_update_is_rejected_when_it_arrives(tmp_path, kind):
    clean, clean_lines = run(tmp_path, "clean")
    summary, poisoned = run(tmp_path, kind, fault_inject=f"{kind}@4")  # dispatched after the first server update
    assert [line["rejected_updates"] for line in clean_lines] == [0, 0, 0, 0]
    assert [line["rejected_updates"] for line in poisoned] == [0, 0, 1, 0]  # dispatch 4's update, and only it
    assert summary["server_updates"] == 4 and summary["params_sha256"] != clean["params_sha256"]
    # the server updates before its arrival are the clean run's
    assert [line["test_loss"] for line in poisoned[:2]] == [line["test_loss"] for line in clean_lines[:2]]
    assert poisoned[2]["test_loss"] != clean_lines[2]["test_loss"]


def test_a_trainer_error_is_one_sentence_naming_the_client_and_its_dispatch(tmp_path):
    out = tmp_path / "run"
    result = CliRunner().invoke(main, [*FLAGS, "--fault-inject", "trainer-error@3", "--out", str(out)])
    assert result.exit_code == 1, result.output
    message = result.output.strip()
    assert message.startswith("Error: training client ") and len(message.splitlines()) == 1
    assert message.endswith(" of dispatch 3 failed (RuntimeError: injected trainer failure (--fault-inject "
                            "trainer-error@3)); the trainer's traceback is in RUN/log.txt")
    assert "injected trainer failure" in (out / "log.txt").read_text()


@pytest.mark.parametrize("flags, words", [
    (["--client-batching", "on"], "client_batching is 'on' but mode is 'async', which does not take it; expected "
                                  "auto or off"),
    (["--client-batching", "mixed"], "client_batching is 'mixed' but mode is 'async'"),
    (["--deadline-policy", "overselect"], "deadline_policy is 'overselect' but mode is 'async', which does not take "
                                          "it; expected it unset"),
])
def test_synchronous_only_keys_are_refused_at_the_cli(tmp_path, flags, words):
    result = CliRunner().invoke(main, [*FLAGS, *flags, "--out", str(tmp_path / "run")])
    assert result.exit_code == 2, result.output
    assert words in result.output and "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) == 1
    assert not os.path.exists(tmp_path / "run")


def test_synchronous_only_keys_are_refused_in_the_config_and_their_defaults_pass():
    with pytest.raises(ConfigError, match="deadline_policy is 'overselect' but mode is 'async'"):
        RunConfig(**ASYNC, deadline_policy="overselect", overselect=0.5)
    assert RunConfig(**ASYNC, client_batching="off").client_batching == "off"
    assert RunConfig(**ASYNC, deadline_policy="drop").deadline_policy == "drop"
    assert RunConfig(**{**ASYNC, "mode": "sync", "concurrency": None, "buffer_size": None},
                     client_batching="on").client_batching == "on"


@pytest.mark.parametrize("kind, value", [("nan-update", "nan"), ("inf-update", "inf")])
def test_the_rejection_says_what_is_not_finite(tmp_path, caplog, kind, value):
    """Battery 5's note: the log said "a non-finite update (loss 1.50…)", naming a finite loss. It names the
    tensor holding the NaN or infinity, how many of its values, and says the loss is finite."""
    run(tmp_path, kind, fault_inject=f"{kind}@4")
    said = [r.message for r in caplog.records if r.name == "hasfl_ray.engine.server" and "rejected" in r.message]
    assert len(said) == 1 and "returned a NaN or infinite value in its update '" in said[0], said
    assert "(1 of " in said[0] and "is finite); rejected" in said[0]
