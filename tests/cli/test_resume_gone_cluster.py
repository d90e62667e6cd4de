"""A run that joined a Ray cluster by address, resumed after that cluster is gone (issue h59): the address comes
from the run's config.yaml, not a flag, yet the sentence said "expected ... or no --address to start Ray on this
machine", which changes nothing (the stored address is kept); now it names where the address came from and the
two ways on: --address of a running cluster, or --backend local."""

import json
import os

import pytest

from tests.cli.sentences import invoke

pytest.importorskip("ray", reason="needs Ray")

SMALL = ["--rounds", "3", "--clients", "6", "--clients-per-round", "3", "--seed", "3", "--checkpoint-every", "1"]


def sha(folder):
    with open(os.path.join(folder, "summary.json")) as handle:
        return json.load(handle)["params_sha256"]


def test_a_run_whose_cluster_is_gone_is_refused_naming_its_config_and_finishes_locally(tmp_path):
    whole = invoke("simulate", *SMALL, "--backend", "local", "--out", tmp_path / "whole")
    assert whole.exit_code == 0, whole.output
    run = tmp_path / "run"
    first = invoke("simulate", *SMALL, "--rounds", "3", "--backend", "local", "--out", run)
    assert first.exit_code == 0, first.output
    os.remove(run / "summary.json")  # stopped after its last checkpoint, as a killed run is
    # as a run that joined a cluster (`--address`) stores it: that cluster is gone now (nothing listens on port 1)
    config = (run / "config.yaml").read_text()
    assert "backend: local\n" in config and "address: null\n" in config
    (run / "config.yaml").write_text(config.replace("backend: local\n", "backend: ray\n")
                                     .replace("address: null\n", "address: 127.0.0.1:1\n"))
    before = {name: (run / name).read_bytes() for name in ("metrics.jsonl", "checkpoints/latest.pt")}
    result = invoke("simulate", "--out", run, "--resume")
    message = result.output.strip()
    assert result.exit_code == 2 and "Traceback" not in message and len(message.splitlines()) == 1, message
    assert message == (
        "Error: the resumed run's address (its config.yaml) is '127.0.0.1:1' but no Ray cluster answered there "
        "(127.0.0.1:1: Connection refused); expected --address of a running cluster (`ray start --head` prints it), "
        "or --backend local to finish the run on this machine")
    assert {name: (run / name).read_bytes() for name in before} == before  # nothing touched
    finished = invoke("simulate", "--out", run, "--resume", "--backend", "local")  # the way the sentence names
    assert finished.exit_code == 0, finished.output
    assert sha(run) == sha(tmp_path / "whole")
