"""Unstructured parameter masks (issue 44 item 1b): a masked client trains w ⊙ m on the full-shape network and
uploads a MaskedUpdate of what it holds; the fused kernel's aggregate of a round of masked clients (and a slice
client beside them) is the float64 dense masked reference (league.common.masked_mean), and FIARSE's round is
league.fiarse.aggregate's."""

import pytest
import torch

from hasfl_ray.aggregation import MaskedUpdate, aggregate_updates
from hasfl_ray.aggregation.packed import pack_bits, unpack_bits
from hasfl_ray.algorithms.fiarse import FIARSEObjective
from hasfl_ray.algorithms.league import common, fiarse as rules
from hasfl_ray.data.base import TensorFederatedDataset
from hasfl_ray.models import build_model
from hasfl_ray.models.slicing import extract
from hasfl_ray.training.local import ClientTask, OptimizerSettings, Trainer


@pytest.fixture(scope="module")
def setup():
    torch.manual_seed(0)
    sizes = [40, 24, 32, 28]
    x = torch.randint(0, 256, (sum(sizes), 1, 8, 8), dtype=torch.uint8)
    y = torch.randint(0, 10, (sum(sizes),))
    dataset = TensorFederatedDataset("digits", "digits", 10, x, y, x[:8], y[:8],
                                     list(torch.arange(sum(sizes)).split(sizes)), mean=[0.5], std=[0.25])
    settings = OptimizerSettings(momentum=0.9, weight_decay=1e-4, clip_norm=1.0, local_epochs=1, batch_size=16)
    model = build_model("digits")
    params = {k: v.detach().clone() for k, v in model.named_parameters()}
    return Trainer(dataset, "digits", settings), params, model.param_specs()


def random_masks(specs, fraction, seed):
    generator = torch.Generator().manual_seed(seed)
    return {name: torch.rand(spec.shape, generator=generator) < fraction
            for name, spec in specs.items() if name.endswith("weight")}


def mask_task(client, masks, **fields):
    return ClientTask(client=client, round=1, width=1.0, lr=0.05, seed=3,
                      masks=tuple((name, pack_bits(mask)) for name, mask in masks.items()), **fields)


def test_a_masked_client_trains_w_times_m_and_uploads_what_it_holds(setup):
    trainer, params, specs = setup
    masks = random_masks(specs, 0.4, 1)
    result = trainer.train(mask_task(0, masks), params)
    # Values outside the mask play no part: the same client with other values there trains the same update.
    shifted = {name: torch.where(masks[name], tensor, tensor + 1.0) if name in masks else tensor
               for name, tensor in params.items()}
    again = trainer.train(mask_task(0, masks), shifted)
    for name, update in result.update.items():
        if name in masks:
            assert isinstance(update, MaskedUpdate)
            assert torch.equal(unpack_bits(update.bits, specs[name].shape), masks[name])
            assert update.values.numel() == int(masks[name].sum()) and bool(update.values.ne(0).any())
            assert torch.equal(update.values, again.update[name].values), name
        else:  # biases travel whole, as a dense full-shape tensor
            assert isinstance(update, torch.Tensor) and tuple(update.shape) == specs[name].shape
            assert torch.equal(update, again.update[name]), name
    assert result.loss == again.loss and result.steps > 0


def test_masked_and_slice_clients_aggregate_to_the_float64_dense_masked_reference(setup):
    trainer, params, specs = setup
    all_masks = [random_masks(specs, fraction, seed) for fraction, seed in ((0.3, 2), (0.6, 3), (0.9, 4))]
    results = [trainer.train(mask_task(client, masks), params) for client, masks in enumerate(all_masks)]
    results.append(trainer.train(ClientTask(client=3, round=1, width=0.5, lr=0.05, seed=3), params))  # a slice
    weights = [40.0, 24.0, 32.0, 28.0]
    shapes = {name: spec.shape for name, spec in specs.items()}
    aggregate = aggregate_updates(shapes, [r.update for r in results], weights, backend="fused")
    for name, spec in specs.items():
        values, held = [], []
        for client, result in enumerate(results):
            dense = torch.zeros(spec.shape, dtype=torch.float64)
            update = result.update[name]
            if client < 3:
                mask = all_masks[client].get(name, torch.ones(spec.shape, dtype=torch.bool))
                dense[mask] = (update.values if isinstance(update, MaskedUpdate) else update[mask]).double()
            else:  # the width-0.5 leading slice
                mask = torch.zeros(spec.shape, dtype=torch.bool)
                region = tuple(slice(0, n) for n in update.shape)
                mask[region] = True
                dense[region] = update.double()
            values.append(dense)
            held.append(mask)
        reference = common.masked_mean(torch.zeros(spec.shape), values, held, weights, name)
        torch.testing.assert_close(aggregate.delta[name].double(), reference, rtol=1e-6, atol=1e-7)


def test_a_fiarse_round_is_the_sources_aggregate(setup):
    trainer, params, specs = setup
    names = rules.scored_names(build_model("digits"))
    deltas, updates = [], []
    for client, size in enumerate((1 / 4, 1 / 16, 1.0)):
        limits = rules.thresholds(params, names, size)
        masks = rules.masks(params, limits)
        masks.update({n: torch.ones(spec.shape, dtype=torch.bool) for n, spec in specs.items() if n not in masks})
        objective = FIARSEObjective({n: float(t) for n, t in limits.items()})
        result = trainer.train(mask_task(client, masks, objective=objective), params)
        updates.append(result.update)
        dense = {}
        for name, update in result.update.items():
            full = torch.zeros(specs[name].shape)
            full[unpack_bits(update.bits, specs[name].shape)] = update.values
            assert not bool((full[~masks[name]] != 0).any())  # nothing outside the downloaded mask moved
            dense[name] = -full  # the source's sign: w^t − w_i
        deltas.append(dense)
    shapes = {name: spec.shape for name, spec in specs.items()}
    aggregate = aggregate_updates(shapes, updates, [1.0, 1.0, 1.0], backend="fused")
    lr_global = 0.7
    expected = rules.aggregate(params, deltas, lr_global)
    for name, tensor in params.items():
        ours = tensor.double() + lr_global * aggregate.delta[name].double()
        torch.testing.assert_close(ours, expected[name].double(), rtol=1e-6, atol=1e-6)
    # the smallest size's client changed no coordinate outside its top 1/16 of scored weights
    held = sum(int(unpack_bits(updates[1][n].bits, specs[n].shape).sum()) for n in names)
    assert 0 < held <= int(sum(specs[n].numel(1.0) for n in names) / 16) + 1


def test_a_slice_extract_is_what_the_slice_client_started_from(setup):
    """(The reference above places a slice client's update at its leading region: the slicer's own cut.)"""
    _, params, specs = setup
    for name, spec in specs.items():
        cut = extract(params[name], spec, 0.5)
        assert torch.equal(cut, params[name][tuple(slice(0, n) for n in cut.shape)])
