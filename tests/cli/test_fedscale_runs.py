"""--devices fedscale:PATH and --availability fedscale:PATH at the command line (issue 47 item 3): a run timed on
FedScale's traces (the files of tests/clock/data, in FedScale's formats: tests/clock/test_fedscale_traces.py), and
a bad trace refused in one sentence with exit status 2, before any run directory is written."""

import csv
import os
import pickle

import pytest

from sentences import invoke, refused

DATA = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "clock", "data")
CAPACITY = os.path.join(DATA, "fedscale_device_capacity.pkl")
BEHAVE = os.path.join(DATA, "fedscale_behave_trace.pkl")
RUN = ("simulate", "--clients", 6, "--clients-per-round", 3, "--rounds", 2, "--backend", "local")


def test_a_run_timed_on_fedscales_traces(tmp_path):
    out = tmp_path / "run"
    result = invoke(*RUN, "--devices", f"fedscale:{CAPACITY}", "--availability", f"fedscale:{BEHAVE}", "--out", out)
    assert result.exit_code == 0, result.output
    capacity = pickle.load(open(CAPACITY, "rb"))
    keys = list(capacity)
    with open(out / "clients.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    for client, row in enumerate(rows):  # client i is FedScale's id i + 1: keys[(i + 1) % len]
        assert float(row["down_bytes_per_s"]) == capacity[keys[(client + 1) % len(keys)]]["communication"] * 125
    config = (out / "config.yaml").read_text()
    assert f"fedscale: {CAPACITY}" in config and f"availability: fedscale:{BEHAVE}" in config
    assert "  devices: " in config and "  availability: " in config  # both pickles hashed into input_sha256
    assert "simulated time" in result.output


@pytest.mark.parametrize("flag, table, words", [
    ("--devices", {1: {"computation": 10.0}}, ("no 'communication' for client 1",)),
    ("--devices", {1: {"computation": -4.0, "communication": 100.0}}, ("computation -4.0", "a number > 0")),
    ("--availability", {1: {"active": [0], "inactive": [10], "duration": 10}}, ("no 'finish_time' for client 1",)),
    ("--devices", b"not a pickle at all", ("not a readable pickle",)),
])
def test_bad_fedscale_traces_are_one_sentence(tmp_path, monkeypatch, flag, table, words):
    monkeypatch.chdir(tmp_path)  # a short relative path in the sentence
    path = "t.pkl"
    (tmp_path / path).write_bytes(table if isinstance(table, bytes) else pickle.dumps(table))
    devices = f"fedscale:{path}" if flag == "--devices" else f"fedscale:{CAPACITY}"
    extra = ("--availability", f"fedscale:{path}") if flag == "--availability" else ()
    result = invoke(*RUN, "--devices", devices, *extra, "--out", tmp_path / "run")
    refused(result, *words)
    assert not (tmp_path / "run" / "summary.json").exists()


def test_a_pickled_object_is_refused_at_the_command_line_unexecuted(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    marker = tmp_path / "ran"

    class Payload:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    path = "evil.pkl"
    (tmp_path / path).write_bytes(pickle.dumps({1: Payload()}))
    refused(invoke(*RUN, "--devices", f"fedscale:{path}", "--out", tmp_path / "run"), "refused, not executed")
    assert not marker.exists()


def test_fedscale_without_a_path_is_refused(tmp_path):
    refused(invoke(*RUN, "--devices", "fedscale:", "--out", tmp_path / "run"), "devices is 'fedscale:'")
