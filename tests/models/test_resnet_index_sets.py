"""Channel index sets on the ResNets (issue 44 item 1a): one index set per stage's residual stream (every block
output, shortcut and norm on it, and the next layer's inputs), one per block's inner conv; a client trains exactly
the sub-network of its channels, with every norm and the Scaler, and its packed update aggregates with slice
clients as the float64 dense masked reference does."""

import pytest
import torch

from hasfl_ray.aggregation import IndexedUpdate, aggregate_updates
from hasfl_ray.aggregation.reference import aggregate_reference
from hasfl_ray.data.base import TensorFederatedDataset
from hasfl_ray.models import build_model, register_model
from hasfl_ray.models.index_slicing import _dim_index, channel_groups, group_names, index_sets, random_channel_sets
from hasfl_ray.models.slicing import width_channels
from hasfl_ray.ops import aggregate as ops
from hasfl_ray.training.local import ClientTask, OptimizerSettings, Trainer

CASES = [("preresnet18", "sbn", True), ("resnet18", "gn", True), ("preresnet18", "bn", False),
         ("resnet18", "none", False)]


def tiny(arch, norm, scaler):
    name = f"h15-tiny-{arch}-{norm}-{scaler}"
    register_model(name, dict(kind=arch, in_channels=3, num_classes=10, image_size=8, norm=norm, scaler=scaler,
                              stages=[8, 8, 16, 16]))
    return name


def dataset_for(model):
    generator = torch.Generator().manual_seed(0)
    sizes = [40, 24, 30]
    x = torch.randint(0, 256, (sum(sizes), 3, 8, 8), dtype=torch.uint8, generator=generator)
    y = torch.randint(0, 10, (sum(sizes),), generator=generator)
    return TensorFederatedDataset("tiny", model, 10, x, y, x[:8], y[:8], list(torch.arange(sum(sizes)).split(sizes)),
                                  mean=[0.5] * 3, std=[0.25] * 3)


def permuted(params, specs, orders):
    """``params`` with every channel group's channels in ``orders[g]`` (every dim of the group alike)."""
    groups, _ = channel_groups(specs)
    out = {}
    for name, tensor in params.items():
        for d, dim in enumerate(specs[name].dims):
            if (name, d) in groups:
                order = torch.as_tensor(orders[groups[(name, d)]])
                tensor = tensor.index_select(d, _dim_index(order, dim.channels, dim.unit, dim.blocks))
        out[name] = tensor.contiguous()
    return out


@pytest.mark.parametrize("arch", ["preresnet18", "resnet18"])
def test_every_tensor_on_a_residual_stream_shares_its_stage_group(arch):
    specs = build_model(tiny(arch, "sbn", True)).param_specs()
    groups, sizes = channel_groups(specs)
    names = group_names(specs)
    assert sizes == [8, 8, 8, 8, 8, 8, 16, 16, 16, 16, 16, 16]
    assert names[0] == "layer1" and "layer2" in names and "layer2.0.conv1" in names
    stream2 = names.index("layer2")
    on_stream = [("layer2.0.conv2.weight", 0), ("layer2.0.shortcut.weight", 0), ("layer2.1.conv2.weight", 0),
                 ("layer3.0.conv1.weight", 1), ("layer3.0.shortcut.weight", 1), ("layer2.1.conv1.weight", 1)]
    on_stream += [("layer2.1.n1.weight", 0)] if arch == "preresnet18" else [("layer2.0.n2.bias", 0),
                                                                              ("layer2.0.shortcut_norm.weight", 0)]
    assert {groups[key] for key in on_stream} == {stream2}
    inner = names.index("layer2.0.conv1")
    assert groups[("layer2.0.conv1.weight", 0)] == groups[("layer2.0.conv2.weight", 1)] == inner
    assert groups[("linear.weight", 1)] == names.index("layer4") and ("linear.weight", 0) not in groups
    assert groups[("conv1.weight", 0)] == groups[("layer1.0.conv1.weight", 1)] == 0
    assert ("conv1.weight", 1) not in groups


@pytest.mark.parametrize("arch, norm, scaler", CASES)
def test_an_index_set_client_trains_exactly_its_sub_network(arch, norm, scaler):
    """Bit for bit the leading-slice client of the global model with its channels moved first (the same
    sub-network extracted by hand), for every norm, with and without the Scaler."""
    model = tiny(arch, norm, scaler)
    trainer = Trainer(dataset_for(model), model, OptimizerSettings(clip_norm=1.0, batch_size=16))
    with torch.random.fork_rng():
        torch.manual_seed(1)
        params = {k: v.detach().clone() for k, v in build_model(model).named_parameters()}
    specs = build_model(model).param_specs()
    channels = random_channel_sets(specs, 0.5, torch.Generator().manual_seed(4))
    task = ClientTask(client=0, round=1, width=0.5, lr=0.05, seed=3, channels=tuple(map(tuple, channels)))
    result = trainer.train(task, params)
    _, sizes = channel_groups(specs)
    orders = [chosen + [c for c in range(size) if c not in chosen] for chosen, size in zip(channels, sizes)]
    by_hand = trainer.train(ClientTask(client=0, round=1, width=0.5, lr=0.05, seed=3), permuted(params, specs, orders))
    sets = index_sets(specs, channels)
    for name, update in result.update.items():
        assert isinstance(update, IndexedUpdate)
        assert all((a is None and b is None) or torch.equal(a, b) for a, b in zip(update.index, sets[name]))
        assert torch.equal(update.values, by_hand.update[name]), name
        assert update.values.shape == tuple(specs[name].sliced_shape(0.5))
    assert result.loss == by_hand.loss and result.steps == by_hand.steps > 0


@pytest.mark.parametrize("backend", ["fused", "reference"])
@pytest.mark.parametrize("arch, norm, scaler", CASES[:2])
def test_a_round_of_index_and_slice_clients_aggregates_as_the_float64_dense_masked_reference(arch, norm, scaler,
                                                                                             backend):
    if backend == "fused" and not (ops.available() and hasattr(torch.ops.hasfl_ray, "aggregate_sparse_into")):
        pytest.skip("needs hasfl_ray._C built with aggregate_sparse_into")
    model = tiny(arch, norm, scaler)
    trainer = Trainer(dataset_for(model), model, OptimizerSettings(clip_norm=1.0, batch_size=16))
    params = {k: v.detach().clone() for k, v in build_model(model).named_parameters()}
    specs = build_model(model).param_specs()
    generator = torch.Generator().manual_seed(9)
    tasks = [ClientTask(0, 1, 0.5, 0.05, 3, channels=tuple(map(tuple, random_channel_sets(specs, 0.5, generator)))),
             ClientTask(1, 1, 0.25, 0.05, 3, channels=tuple(map(tuple, random_channel_sets(specs, 0.25, generator)))),
             ClientTask(2, 1, 0.5, 0.05, 3)]
    updates = [trainer.train(task, params).update for task in tasks]
    shapes = {name: spec.shape for name, spec in specs.items()}
    weights = [40.0, 24.0, 30.0]
    got = aggregate_updates(shapes, updates, weights, backend=backend)
    # the float64 dense masked reference, written out: every client's update spread over the full shapes with the
    # 0/1 mask of what it holds, then sum_i w_i m_i u_i / sum_i w_i m_i where any client holds the coordinate
    for name, shape in shapes.items():
        num = torch.zeros(shape, dtype=torch.float64)
        den = torch.zeros(shape, dtype=torch.float64)
        for task, update, weight in zip(tasks, updates, weights):
            dense, mask = torch.zeros(shape, dtype=torch.float64), torch.zeros(shape, dtype=torch.bool)
            if task.channels is None:
                region = tuple(slice(0, s) for s in update[name].shape)
                dense[region], mask[region] = update[name].double(), True
            else:
                grids = [torch.arange(s) if i is None else i for i, s in zip(update[name].index, shape)]
                cells = torch.meshgrid(*grids, indexing="ij")
                dense[cells], mask[cells] = update[name].values.double(), True
            num += weight * dense
            den += weight * mask
        expected = torch.where(den > 0, num / torch.where(den > 0, den, 1.0), 0.0)
        torch.testing.assert_close(got.delta[name].double(), expected, rtol=1e-6, atol=1e-7)
    reference = aggregate_reference(shapes, updates, torch.tensor(weights), {})
    torch.testing.assert_close(got.div_num.double(), reference.div_num, rtol=1e-5, atol=1e-9)
    # the client of width 0.25 holds ceil(0.25 x C) channels of each group
    assert all(len(c) == width_channels(0.25, s) for c, s in zip(tasks[1].channels, channel_groups(specs)[1]))


def test_an_exit_head_has_no_channel_group_and_is_refused_in_one_sentence():
    name = "h15-tiny-exits"
    register_model(name, dict(kind="preresnet18", in_channels=3, num_classes=10, image_size=8, stages=[8, 8, 16, 16],
                              exits=True))
    with pytest.raises(ValueError, match=r"scales dim 0 outside any named channel group; expected every scaled dim "
                                         r"of a residual network to name its group \(an exit head has none\)$"):
        channel_groups(build_model(name).param_specs())
