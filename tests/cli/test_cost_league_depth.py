"""`hasfl-ray cost --algorithm depthfl|scalefl` (issue 44 item 2): what a client of each size trains and sends, exits
included, and the device clock's DepthFL extra (FedDyn's local terms)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from hasfl_ray.cli.main import main
from hasfl_ray.models import build_model
from hasfl_ray.models.depth import depth_names


def rows(*args):
    result = CliRunner().invoke(main, ["cost", *args, "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def held_params(name, depth, width):
    full = build_model(name)
    specs = full.param_specs()
    return sum(specs[n].numel(width) for n in depth_names(full, depth))


def test_depthfl_prices_each_size_at_full_width_up_to_its_depth():
    table = rows("--model", "preresnet18", "--algorithm", "depthfl")
    assert [(r["size"], r["depth"], r["p"]) for r in table] == [(0.25, 1, 1.0), (0.5, 2, 1.0), (0.75, 3, 1.0),
                                                                (1.0, 4, 1.0)]
    whole = rows("--model", "preresnet18", "--depths", "4")[0]
    assert table[-1]["params"] == whole["params"] and table[-1]["flops"] == whole["flops"]
    assert all(a["params"] < b["params"] and a["flops"] < b["flops"] for a, b in zip(table, table[1:]))


def test_scalefl_prices_each_level_at_its_width_up_to_its_exit():
    assert [r["depth"] for r in rows("--model", "resnet18", "--algorithm", "scalefl")] == [1, 2, 3, 4]  # the source's
    table = rows("--model", "digits", "--algorithm", "scalefl")  # auto: ceil(size x stages)
    assert [(r["size"], r["depth"], r["p"]) for r in table] == [(0.25, 1, 0.25), (0.5, 1, 0.5), (0.75, 2, 0.75),
                                                                (1.0, 2, 1.0)]
    for row in table:
        assert row["params"] == held_params("digits+exits", row["depth"], row["p"])
        assert row["upload_mb"] == row["params"] * 4 / 1e6
        assert row["macs"] == build_model("digits+exits", 1.0, row["depth"]).macs(row["p"])


def test_scalefl_prices_a_resnet_with_the_sources_exit_heads():
    """h76: on a ResNet, ScaleFL's rows are of the model its runs build, exits 1-3 the source's Classifier
    (``scalefl_exit_head: source``, the default; hasfl_ray.models.depth_heads); DepthFL's keep DepthFL's exits."""
    from hasfl_ray.cli.cost import resnet_on

    name = resnet_on("resnet18", "cifar10", None, "scalefl")
    assert "exit1.conv3.weight" in build_model(name).param_specs()
    for row in rows("--model", "resnet18", "--algorithm", "scalefl"):
        assert row["params"] == held_params(name, row["depth"], row["p"])
        assert row["macs"] == build_model(name, 1.0, row["depth"]).macs(row["p"])
    depthfl = resnet_on("resnet18", "cifar10", None, "depthfl")
    assert "exit1.att.dw1.weight" in build_model(depthfl).param_specs()
    assert rows("--model", "resnet18", "--algorithm", "depthfl")[0]["params"] == held_params(depthfl, 1, 1.0)


def test_depths_that_do_not_fit_are_one_sentence_and_exit_2():
    result = CliRunner().invoke(main, ["cost", "--model", "digits", "--algorithm", "scalefl", "--depths", "1,2,3,4"])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert result.output.strip() == ("Error: --depths is '1,2,3,4' for --algorithm scalefl but model 'digits' has 2 "
                                     "depths and the sizes are 0.25, 0.5, 0.75, 1; expected one depth from 1 to 2 per "
                                     "size")
    result = CliRunner().invoke(main, ["cost", "--model", "synthetic", "--algorithm", "depthfl"])
    assert result.exit_code == 2 and "has no stages with exits" in result.output


def test_the_clock_charges_depthfl_its_depth_and_feddyns_terms():
    """A clocked DepthFL client pays its depth sub-model's bytes and training MACs plus two multiply-adds a held
    parameter every step (FedDyn); without FedDyn, the depth sub-model's cost alone."""
    from hasfl_ray.engine import Engine, RunConfig

    config = dict(dataset="digits", algorithm="depthfl", rounds=1, clients=6, clients_per_round=3, backend="local",
                  devices="lognormal")
    engine = Engine(RunConfig(**config))
    engine.prepare()
    algorithm, clock = engine.algorithm, engine.clock
    for client in range(6):
        depth = algorithm.depth_plan.depth_of(float(algorithm.p_current[client]))
        base = clock.base_cost(client, 1.0, depth)
        cost = algorithm.client_cost(0, client, 1.0, base)
        assert cost.bytes_up == base.bytes_up == 4 * clock.costs.params(1.0, depth)
        assert np.array_equal(cost.step_macs, base.step_macs + 2 * clock.costs.params(1.0, depth))
    plain = Engine(RunConfig(**config, algorithm_options={"depthfl_feddyn": False}))
    plain.prepare()
    base = plain.clock.base_cost(0, 1.0, 1)
    assert np.array_equal(plain.algorithm.client_cost(0, 0, 1.0, base).step_macs, base.step_macs)
    engine.backend.shutdown()
    plain.backend.shutdown()


@pytest.mark.parametrize("method", [["scalefl", "--algo-opt", "scalefl_exits=1,1,2,2"],
                                    ["depthfl", "--algo-opt", "depthfl_feddyn=false"]])
def test_the_methods_run_in_the_asynchronous_mode(tmp_path, method):
    """ScaleFL's rule and DepthFL's without FedDyn have an asynchronous meaning (the round index is the server's
    version): a run completes."""
    result = CliRunner().invoke(main, ["simulate", "--dataset", "digits", "--algorithm", *method, "--mode", "async",
                                       "--devices", "lognormal",
                                       "--rounds", "3", "--clients", "6", "--clients-per-round", "3", "--backend",
                                       "local", "--quiet", "--out", str(tmp_path / "run")])
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["params_sha256"]


@pytest.mark.parametrize("algorithm", ["depthfl", "scalefl"])
def test_depths_pair_with_the_widths_in_the_order_given_as_a_run_pairs_them(algorithm):
    """`--depths` is one depth per width in --widths order, as simulate's (the league's configs: widths 1, 0.5, 0.25,
    0.125 with depths 4, 3, 2, 1). cost paired the depths with the sizes sorted ascending, so the league's DepthFL
    ladder priced size 1 at depth 1 and size 0.125 at depth 4, against what its runs' clock charged (h57)."""
    from types import SimpleNamespace

    from hasfl_ray.models.depth_plan import depth_plan

    table = rows("--model", "digits", "--algorithm", algorithm, "--widths", "1,0.5", "--depths", "2,1")
    assert [(r["size"], r["depth"]) for r in table] == [(0.5, 1), (1.0, 2)]
    assert table == rows("--model", "digits", "--algorithm", algorithm, "--widths", "0.5,1", "--depths", "1,2")
    config = SimpleNamespace(sub_model="width_depth" if algorithm == "scalefl" else "depth", widths=[1.0, 0.5],
                             width_mix=None, tier_counts=None, depths=[2, 1])
    plan = depth_plan(config, "digits+exits")  # the model a depth run of the digits builds
    assert [(r["size"], r["depth"]) for r in table] == [(w, plan.depth_of(w)) for w in (0.5, 1.0)]


@pytest.mark.parametrize("algorithm", ["fedavg", "fedprox", "scaffold", "uniform"])
@pytest.mark.parametrize("model", ["resnet18", "cifar100"])
def test_full_model_and_uniform_methods_price_the_width_their_clients_train(algorithm, model):
    """`cost --algorithm fedavg` (fedprox, scaffold) on the league's ladder priced a size-1/8 client at the width-1/8
    slice (182,252 parameters on CIFAR-100's ResNet-18), but FedAvg's clients all train the whole model (p_i = 1);
    Uniform's train min(0.5, size), so its size-1 row priced 4x the bytes its clients send."""
    sizes = [1.0, 0.5, 0.25, 0.125]
    extra = ["--dataset", "cifar100"] if model == "resnet18" else []
    table = rows("--model", model, *extra, "--widths", ",".join(map(str, sizes)), "--algorithm", algorithm)
    assert [row["size"] for row in table] == sizes
    from hasfl_ray.algorithms import algorithm_class
    from hasfl_ray.engine import RunConfig

    config = RunConfig(dataset="cifar100", algorithm=algorithm, clients=4, clients_per_round=4, rounds=1, seed=3)
    method = algorithm_class(algorithm)(config, np.array(sizes), np.full(4, 10))
    assert [row["p"] for row in table] == method.capacity_allocation(np.array(sizes)).tolist()  # what a run trains
    assert [row["p"] for row in table] == ([1.0] * 4 if algorithm != "uniform" else [0.5, 0.5, 0.25, 0.125])
    for row in table:  # each row is the slice of the width trained, as `cost --widths` prices it alone
        alone = rows("--model", model, *extra, "--widths", str(row["p"]))[0]
        assert {key: row[key] for key in alone} == alone
    text = CliRunner().invoke(main, ["cost", "--model", model, *extra, "--algorithm", algorithm])
    assert text.exit_code == 0 and text.output.split()[:2] == ["size", "p"], text.output


def test_width_slicing_methods_print_the_slice_of_each_size():
    """The methods whose clients train their size's slice keep the plain table (no size column)."""
    for algorithm in ("heterofl", "fedrolex", "fjord", "hasfl"):
        table = rows("--model", "resnet18", "--widths", "1,0.5", "--algorithm", algorithm)
        assert "size" not in table[0] and [row["p"] for row in table] == [1.0, 0.5]


def test_scalefl_depths_that_give_a_wider_size_fewer_exits_are_refused_as_a_run_refuses_them():
    """h71: `cost --algorithm scalefl --widths 1,0.5 --depths 1,2` priced width 1 at one exit and width 0.5 at two,
    ScaleFL's levels inverted, which simulate now refuses; DepthFL (full width at every depth) takes any pairing."""
    result = CliRunner().invoke(main, ["cost", "--model", "digits", "--algorithm", "scalefl", "--widths", "1,0.5",
                                       "--depths", "1,2"])
    text = result.output.strip()
    assert result.exit_code == 2 and len(text.splitlines()) == 1, text
    assert "--depths is '1,2' for --algorithm scalefl, which gives width 1 fewer exits (1) than the narrower width " \
           "0.5 (2)" in text
    for algorithm, depths in (("scalefl", "2,1"), ("depthfl", "1,2")):
        result = CliRunner().invoke(main, ["cost", "--model", "digits", "--algorithm", algorithm, "--widths", "1,0.5",
                                           "--depths", depths])
        assert result.exit_code == 0, result.output
