"""`bench aggregate` says where it is (issue 45 item 5): "case k of n" before each case, with an estimate of the time
left from the cases done, on stderr (stdout stays the tables, or one JSON document with --json)."""

import json

from click.testing import CliRunner

from hasfl_ray.bench.federation import bytes_per_client
from hasfl_ray.cli.bench import case_line
from hasfl_ray.cli.main import main


def test_the_estimate_scales_the_time_so_far_by_the_bytes_left():
    plan = [("emnist", 10), ("emnist", 30), ("shakespeare", 10)]
    assert case_line(0, plan, 0.0) == "case 1 of 3: EMNIST CNN, 10 clients"
    # 10 clients took 20 s: the 30 of the second case and the 10 Shakespeare clients are scaled by their bytes
    left = 20.0 / (10 * bytes_per_client("emnist")) * (30 * bytes_per_client("emnist") +
                                                       10 * bytes_per_client("shakespeare"))
    assert case_line(1, plan, 20.0) == f"case 2 of 3: EMNIST CNN, 30 clients (20 s so far, about {left:.0f} s left)"
    assert case_line(2, plan, 4000.0).startswith("case 3 of 3: Shakespeare LSTM, 10 clients (67 min so far, about ")


def test_each_case_is_announced_on_stderr_and_json_stays_whole():
    result = CliRunner().invoke(main, ["bench", "aggregate", "--models", "shakespeare", "--clients", "2,3",
                                       "--repeats", "1", "--skip-slow", "--json"])
    assert result.exit_code == 0, result.output
    cases = [line for line in result.stderr.splitlines() if line.startswith("case ")]
    assert [line.split(" (")[0] for line in cases] == \
        ["case 1 of 2: Shakespeare LSTM, 2 clients", "case 2 of 2: Shakespeare LSTM, 3 clients"]
    assert "so far, about " in cases[1] and "so far" not in cases[0]
    assert [case["clients"] for case in json.loads(result.stdout)] == [2, 3]
