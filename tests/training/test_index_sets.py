"""A client holding per-layer channel index sets trains the narrower network of exactly those channels (issue 44
item 1a): bit-identical to training the leading slice of the global model with those channels moved first."""

import pytest
import torch

from hasfl_ray.aggregation import IndexedUpdate
from hasfl_ray.data.base import TensorFederatedDataset
from hasfl_ray.models import build_model
from hasfl_ray.models.index_slicing import _dim_index, channel_groups, index_sets, random_channel_sets
from hasfl_ray.training.local import ClientTask, OptimizerSettings, Trainer


@pytest.fixture(scope="module")
def trainer_and_params():
    torch.manual_seed(0)
    sizes = [40, 24]
    x = torch.randint(0, 256, (sum(sizes), 1, 8, 8), dtype=torch.uint8)
    y = torch.randint(0, 10, (sum(sizes),))
    dataset = TensorFederatedDataset("digits", "digits", 10, x, y, x[:8], y[:8],
                                     list(torch.arange(sum(sizes)).split(sizes)), mean=[0.5], std=[0.25])
    settings = OptimizerSettings(momentum=0.9, weight_decay=1e-4, clip_norm=1.0, local_epochs=1, batch_size=16)
    params = {k: v.detach().clone() for k, v in build_model("digits").named_parameters()}
    return Trainer(dataset, "digits", settings), params


def permuted(params, specs, orders):
    """``params`` with every channel group's channels in ``orders[g]`` (the next layer's inputs alike)."""
    groups, _ = channel_groups(specs)
    out = {}
    for name, tensor in params.items():
        for d, dim in enumerate(specs[name].dims):
            if (name, d) in groups:
                order = torch.as_tensor(orders[groups[(name, d)]])
                tensor = tensor.index_select(d, _dim_index(order, dim.channels, dim.unit, dim.blocks))
        out[name] = tensor.contiguous()
    return out


def test_index_set_client_trains_exactly_its_channels(trainer_and_params):
    trainer, params = trainer_and_params
    specs = build_model("digits").param_specs()
    channels = random_channel_sets(specs, 0.5, torch.Generator().manual_seed(4))
    task = ClientTask(client=0, round=1, width=0.5, lr=0.05, seed=3, channels=tuple(map(tuple, channels)))
    result = trainer.train(task, params)
    sets = index_sets(specs, channels)
    _, sizes = channel_groups(specs)
    orders = [chosen + [c for c in range(size) if c not in chosen] for chosen, size in zip(channels, sizes)]
    slice_result = trainer.train(ClientTask(client=0, round=1, width=0.5, lr=0.05, seed=3),
                                 permuted(params, specs, orders))
    for name, update in result.update.items():
        assert isinstance(update, IndexedUpdate)
        assert all((a is None and b is None) or torch.equal(a, b) for a, b in zip(update.index, sets[name]))
        assert torch.equal(update.values, slice_result.update[name]), name
    assert result.loss == slice_result.loss and result.steps == slice_result.steps > 0


def test_channels_that_do_not_fit_the_width_are_one_sentence(trainer_and_params):
    trainer, params = trainer_and_params
    specs = build_model("digits").param_specs()
    channels = random_channel_sets(specs, 0.25, torch.Generator().manual_seed(4))
    task = ClientTask(client=0, round=1, width=0.5, lr=0.05, seed=3, channels=tuple(map(tuple, channels)))
    with pytest.raises(ValueError, match=r"client 0's channels\[0\] holds 8 of 32 channels; expected "
                                         r"ceil\(0.5 x 32\) = 16, its width's"):
        trainer.train(task, params)
