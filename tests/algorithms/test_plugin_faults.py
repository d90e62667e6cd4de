"""A plug-in algorithm cannot corrupt the model or leak a traceback (issue 18 item 6): an exception in any of its
methods is one sentence naming the plug-in and the method (traceback in RUN/log.txt), a bad return value is one
sentence naming it, a zero weight leaves that client out, and an update that would make the global model
non-finite stops the run in one sentence with the last checkpoint intact."""

import json
import textwrap

import pytest
from click.testing import CliRunner

from hasfl_ray.cli.main import main

TINY = ["simulate", "--backend", "local", "--rounds", "3", "--clients", "6", "--clients-per-round", "3", "--quiet",
        "--checkpoint-every", "1"]

#: (class body lines, words the sentence must hold, whether the traceback goes to log.txt)
CASES = {
    "init": ("def __init__(self, *a):\n    raise RuntimeError('boom in init')", ["__init__()", "boom in init"], False),
    "allocate": ("def allocate(self, round, participants):\n    raise ValueError('boom')",
                 ["raised ValueError in allocate()", "RUN/log.txt"], True),
    "observe": ("def observe(self, round, results, aggregate):\n    if round == 1: raise KeyError('h')",
                ["raised KeyError in observe()"], True),
    # inspect_updates is given w^t and the updates (an assertion failing first would name AssertionError)
    "inspect_updates": ("def inspect_updates(self, round, global_params, results):\n"
                        "    assert global_params and results and all(r.update for r in results)\n"
                        "    raise KeyError('seen')", ["raised KeyError in inspect_updates()"], True),
    "empty_allocation": ("def allocate(self, round, participants):\n    return {}",
                         ["from allocate()", "a width for each of the 3 participants"], False),
    "width_2": ("def allocate(self, round, participants):\n    return {i: 2.0 for i in participants}",
                ["width for client", "2.0", "(0, 1]"], False),
    "nan_weights": ("def aggregation_weights(self, clients):\n    return [float('nan')] * len(clients)",
                    ["aggregation_weights()", "finite non-negative weights"], False),
    "zero_weights": ("def aggregation_weights(self, clients):\n    return [0.0] * len(clients)",
                     ["aggregation_weights()", "not all zero"], False),
    "short_weights": ("def aggregation_weights(self, clients):\n    return [1.0]",
                      ["1 weights", "one per participant (3)"], False),
    "negative_offset": ("def window_offset(self, round, client):\n    return -2",
                        ["window_offset()", "-2", "non-negative integer"], False),
    "function_state": ("def state_dict(self):\n    return {'p_current': self.p_current, 'f': print}",
                       ["state_dict()", "cannot hold"], False),
    "server_lr_inf": ("server_lr = float('inf')", ["server_lr", "inf", "finite server step"], False),
}


def plugin(tmp_path, body):
    path = tmp_path / "plugin.py"
    path.write_text("from hasfl_ray.algorithms.uniform import *\nfrom hasfl_ray.algorithms.base import Algorithm\n\n"
                    "class Bad(Algorithm):\n" + textwrap.indent(body, "    ") + "\n")
    return f"{path}:Bad"


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_faulty_plugin_is_one_sentence_and_keeps_the_model(tmp_path, case):
    body, words, traced = CASES[case]
    out = tmp_path / "run"
    result = CliRunner().invoke(main, TINY + ["--algorithm", plugin(tmp_path, body), "--out", str(out)])
    message = result.output.strip()
    assert result.exit_code in (1, 2), message
    assert "Traceback" not in message and len(message.splitlines()) == 1 and message.startswith("Error: "), message
    assert "'Bad'" in message, message
    for word in words:
        assert word in message, (word, message)
    if traced:
        assert "Traceback" in (out / "log.txt").read_text()
    if (out / "metrics.jsonl").exists():  # every round written holds a finite model's numbers
        for line in map(json.loads, (out / "metrics.jsonl").open()):
            assert line["test_loss"] == line["test_loss"] and line["test_loss"] < float("inf")


def test_one_zero_weight_leaves_that_client_out_and_the_rest_are_aggregated(tmp_path):
    body = "def aggregation_weights(self, clients):\n    return [0.0] + [1.0] * (len(clients) - 1)"
    out = tmp_path / "run"
    result = CliRunner().invoke(main, TINY + ["--algorithm", plugin(tmp_path, body), "--out", str(out), "-v"])
    assert result.exit_code == 0, result.output
    lines = [json.loads(line) for line in (out / "metrics.jsonl").open()]
    assert [line["rejected_updates"] for line in lines] == [0, 0, 0]  # left out, not "non-finite"
    assert "aggregation weight 0 and are left out" in (out / "log.txt").read_text()


def test_a_server_step_that_overflows_the_model_stops_the_run_with_the_checkpoint_intact(tmp_path):
    body = "server_lr = 3e38\ndef observe(self, round, results, aggregate):\n    pass"
    out = tmp_path / "run"
    result = CliRunner().invoke(main, TINY + ["--algorithm", plugin(tmp_path, body), "--out", str(out), "--lr", "1"])
    message = result.output.strip()
    assert result.exit_code == 1 and "would make the global model non-finite" in message, message
    assert len(message.splitlines()) == 1
    assert not (out / "summary.json").exists()
