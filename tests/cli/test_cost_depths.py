"""`hasfl-ray cost --depths` (issue 44 item 1c): params, MACs, FLOPs and upload bytes of depth sub-models."""

from __future__ import annotations

import json

from click.testing import CliRunner

from hasfl_ray.cli.main import main
from hasfl_ray.models import build_model
from hasfl_ray.models.depth import depth_names


def rows(*args):
    result = CliRunner().invoke(main, ["cost", *args, "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def test_each_depth_is_priced_from_what_it_holds_and_trains():
    table = rows("--model", "digits", "--depths", "1,2", "--widths", "1,0.5")
    assert [(r["depth"], r["p"]) for r in table] == [(1, 1.0), (1, 0.5), (2, 1.0), (2, 0.5)]
    full = build_model("digits+exits")
    specs = full.param_specs()
    for row in table:
        held = depth_names(full, row["depth"])
        assert row["params"] == sum(specs[n].numel(row["p"]) for n in held)
        assert row["upload_mb"] == row["params"] * 4 / 1e6
        assert row["macs"] == build_model("digits+exits", 1.0, row["depth"]).macs(row["p"])
    assert table[2]["params"] == sum(s.numel(1.0) for s in specs.values())  # the deepest holds everything
    assert table[0]["macs"] < table[2]["macs"] and table[1]["params"] < table[0]["params"]


def test_the_resnet_at_full_depth_is_the_network_plus_its_exits():
    (row,) = rows("--model", "preresnet18", "--depths", "4")
    plain = rows("--model", "preresnet18", "--widths", "1")[0]
    assert row["params"] > plain["params"] and row["macs"] > plain["macs"] and row["flops"] > plain["flops"]


def test_a_depth_the_model_lacks_is_one_sentence_and_exit_2():
    result = CliRunner().invoke(main, ["cost", "--model", "digits", "--depths", "1,3"])
    assert result.exit_code == 2
    assert result.output.strip() == ("Error: --depths is '1,3': depth is 3, which model 'digits+exits' lacks; "
                                     "expected an integer from 1 to 2 (its stages)")
    result = CliRunner().invoke(main, ["cost", "--model", "synthetic", "--depths", "1"])
    assert result.exit_code == 2 and "has no stages with exits" in result.output and "Traceback" not in result.output


def test_a_flag_the_depth_table_does_not_price_is_refused_not_dropped():
    """h71: --index-sets beside --depths printed the depth table without its index columns, and --algorithm fedavg,
    fedprox, scaffold or uniform (whose clients train another width than their size's) the plain depth table, each
    dropped in silence, exit 0. Now one sentence naming both flags, exit 2; a method that trains each size's own
    width (hasfl) still prints the plain depth table."""
    for flags, words in [(["--index-sets"], ["--index-sets with --depths '1,2'", "one sub-model shape"]),
                         (["--algorithm", "fedavg"], ["--depths is '1,2' with --algorithm fedavg", "another width"]),
                         (["--algorithm", "uniform"], ["--depths is '1,2' with --algorithm uniform", "depthfl"])]:
        result = CliRunner().invoke(main, ["cost", "--model", "digits", "--depths", "1,2", *flags])
        message = result.output.strip()
        assert result.exit_code == 2 and len(message.splitlines()) == 1 and message.startswith("Error: "), message
        assert all(word in message for word in words), (words, message)
    assert rows("--model", "digits", "--depths", "1,2", "--algorithm", "hasfl") == rows("--model", "digits",
                                                                                       "--depths", "1,2")
