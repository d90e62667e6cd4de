"""What a channel-index-set client moves (issue 44 items 1a and 2): its held values plus its index lists, int64 as
:class:`IndexedUpdate` carries them over the wire, counted by the clock (``index_list_bytes``), by FLuID's
``client_cost`` for a straggler, and by ``hasfl-ray cost --index-sets``."""

import json

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from hasfl_ray.clock.cost import BYTES_PER_PARAM, ClientCost, index_bytes_of, index_list_bytes
from hasfl_ray.cli.main import main
from hasfl_ray.models import build_model, register_model
from hasfl_ray.models.index_slicing import extract_indexed, index_sets, random_channel_sets


def tiny_resnet():
    register_model("h15-cost-resnet", dict(kind="resnet18", in_channels=3, num_classes=10, image_size=8, norm="gn",
                                           scaler=True, stages=[8, 8, 16, 16]))
    return "h15-cost-resnet"


@pytest.mark.parametrize("model", ["cifar10", "digits", "synthetic", "resnet"])
@pytest.mark.parametrize("width", [0.25, 0.5, 1.0])
def test_index_bytes_are_what_an_index_set_update_carries_beyond_its_values(model, width):
    model = tiny_resnet() if model == "resnet" else model
    specs = build_model(model).param_specs()
    params = {name: torch.zeros(spec.shape) for name, spec in specs.items()}
    packed = extract_indexed(params, index_sets(specs, random_channel_sets(specs, width, torch.Generator())))
    values = sum(update.values.numel() for update in packed.values())
    assert values == sum(spec.numel(width) for spec in specs.values())  # the held values: the width-p network's
    wire = sum(update.nbytes() for update in packed.values())
    assert wire == BYTES_PER_PARAM * values + index_list_bytes(model, width)
    assert all(i.dtype == torch.int64 for u in packed.values() for i in u.index if i is not None)


def test_a_client_on_channel_sets_pays_its_index_lists_both_ways():
    """FLuID's straggler, through the default ``Algorithm.client_cost`` (any policy's channel sets alike)."""
    from hasfl_ray.algorithms.fluid import FLuID
    from hasfl_ray.engine import RunConfig

    config = RunConfig(dataset="digits", algorithm="fluid", clients=4, clients_per_round=4, rounds=5, seed=3)
    algorithm = FLuID(config, np.array([1.0, 1.0, 1.0, 0.5]), np.array([10, 10, 10, 10]))
    algorithm.model_name = "digits"
    algorithm.allocate(2, [0, 3])  # rnd 3: client 3 (lowest p^max) is a straggler at 0.5
    base = ClientCost(0.5, 1000, 1000, np.array([10]), np.array([5]))
    extra = index_list_bytes("digits", 0.5)
    cost = algorithm.client_cost(2, 3, 0.5, base)
    assert (cost.bytes_down, cost.bytes_up) == (1000 + extra, 1000 + extra) and extra > 0
    assert algorithm.client_cost(2, 0, 1.0, base) is base


def test_cost_index_sets_prints_the_index_lists():
    result = CliRunner().invoke(main, ["cost", "--model", "digits", "--index-sets", "--json"])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.output)
    specs = build_model("digits").param_specs()
    for row in rows:
        assert row["index_bytes"] == index_bytes_of(specs, row["p"])
        assert row["index_upload_mb"] == pytest.approx((4 * row["params"] + row["index_bytes"]) / 1e6)
    refused = CliRunner().invoke(main, ["cost", "--model", "shakespeare", "--index-sets"])
    assert refused.exit_code == 2 and refused.output.strip() == (
        "Error: --index-sets with --model 'shakespeare'; expected a model of channel groups (an image CNN, an MLP or "
        "a ResNet), not a recurrent one")


def test_cost_algorithm_fluid_prices_what_fluids_clients_move():
    """`cost --algorithm fluid` printed the slice table, without the index lists a FLuID straggler moves and the
    clock charges (its help said every other built-in trains the width-p slice). Now its rows carry them where
    FLuID's ``client_cost`` charges them: a straggler's width p < 1, and nothing at p = 1 (a non-straggler)."""
    from hasfl_ray.algorithms.fluid import FLuID
    from hasfl_ray.engine import RunConfig

    result = CliRunner().invoke(main, ["cost", "--model", "digits", "--algorithm", "fluid", "--widths", "0.5,1",
                                       "--json"])
    assert result.exit_code == 0, result.output
    rows = {row["p"]: row for row in json.loads(result.output)}
    config = RunConfig(dataset="digits", algorithm="fluid", clients=4, clients_per_round=4, rounds=5, seed=3)
    algorithm = FLuID(config, np.array([1.0, 1.0, 1.0, 0.5]), np.array([10, 10, 10, 10]))
    algorithm.model_name = "digits"
    algorithm.allocate(2, [0, 3])  # rnd 3: client 3 a straggler at 0.5, client 0 at full width
    for client, p in ((3, 0.5), (0, 1.0)):
        plain = ClientCost(p, 4 * rows[p]["params"], 4 * rows[p]["params"], np.array([10]), np.array([5]))
        charged = algorithm.client_cost(2, client, p, plain)
        assert charged.bytes_up == 4 * rows[p]["params"] + rows[p]["index_bytes"]
        assert rows[p]["index_upload_mb"] == pytest.approx(charged.bytes_up / 1e6)
    assert rows[0.5]["index_bytes"] > 0 and rows[1.0]["index_bytes"] == 0
    text = CliRunner().invoke(main, ["cost", "--model", "digits", "--algorithm", "fluid"]).output
    assert text.splitlines()[0].endswith("upload MB upload+index MB")  # the whole upload with the lists, not the lists
    refused = CliRunner().invoke(main, ["cost", "--model", "shakespeare", "--algorithm", "fluid"])
    assert refused.exit_code == 2 and refused.output.startswith("Error: --algorithm fluid with --model 'shakespeare'")
