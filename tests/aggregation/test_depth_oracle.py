"""Depth sub-models (issue 44 item 1c) through the aggregation: clients of mixed widths and depths in one round,
each update packed (the width-p slices of only the parameters its depth holds), gathered by the fused kernel and by
the reference, against a float64 dense masked definition written out here."""

from __future__ import annotations

import math

import pytest
import torch

from hasfl_ray.aggregation import aggregate_updates, fused_available
from hasfl_ray.models.cnn import ImageCNN
from hasfl_ray.models.depth import depth_names
from hasfl_ray.models.resnet import PreResNet18, ResNet18
from hasfl_ray.models.slicing import region

BACKENDS = ["reference"] + (["fused"] if fused_available() else [])


def small_models():
    return {"preresnet18": PreResNet18(stages=(4, 8, 8, 16), exits=True),
            "resnet18": ResNet18(stages=(4, 8, 8, 16), exits=True, norm="bn"),
            "cnn": ImageCNN(1, 10, 8, ((6,), (8,)), 12, exits=True),
            # ScaleFL's width_depth clients with the source's exit heads (hasfl_ray.models.depth_heads)
            "preresnet18-scalefl": PreResNet18(stages=(4, 8, 8, 16), exits=True, exit_head="scalefl"),
            "resnet18-scalefl": ResNet18(stages=(4, 8, 8, 16), exits=True, norm="bn", exit_head="scalefl")}


def packed_updates(model, shapes, seed):
    """One packed update per (width, depth): the held parameters only, each its leading width-p slice."""
    specs = model.param_specs()
    generator = torch.Generator().manual_seed(seed)
    updates = []
    for width, depth in shapes:
        updates.append({name: torch.randn(specs[name].sliced_shape(width), generator=generator, dtype=torch.float32)
                        for name in depth_names(model, depth)})
    return specs, updates


def dense_masked(specs, updates, weights):
    """The definition in float64: every client's update zero-padded to the full shape with its 0/1 mask m_i (0 on
    the parameters it does not hold); mean = sum w_i m_i u_i / sum w_i m_i where covered, else 0; the divergence
    norms sum m_i (u_i - mean)^2 and sum m_i mean^2."""
    delta, num, den = {}, torch.zeros(len(updates), dtype=torch.float64), torch.zeros(len(updates), dtype=torch.float64)
    for name, spec in specs.items():
        masks, padded = [], []
        for update in updates:
            m = torch.zeros(spec.shape, dtype=torch.float64)
            u = torch.zeros(spec.shape, dtype=torch.float64)
            if name in update:
                region(m, update[name].shape).fill_(1)
                region(u, update[name].shape).copy_(update[name].to(torch.float64))
            masks.append(m)
            padded.append(u)
        total = sum(w * m for w, m in zip(weights, masks))
        mean = torch.where(total > 0, sum(w * m * u for w, m, u in zip(weights, masks, padded)) /
                           torch.where(total > 0, total, torch.ones_like(total)), torch.zeros_like(total))
        delta[name] = mean
        for i, (m, u) in enumerate(zip(masks, padded)):
            num[i] += (m * (u - mean) ** 2).sum()
            den[i] += (m * mean ** 2).sum()
    return delta, num, den


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("arch", ["preresnet18", "resnet18", "cnn", "preresnet18-scalefl", "resnet18-scalefl"])
def test_mixed_widths_and_depths_match_the_dense_masked_definition(arch, backend):
    model = small_models()[arch]
    top = model.num_depths
    # full, width-only, depth-only, both, and a repeated shape: mixed widths and depths in one round
    shapes = [(1.0, top), (0.5, top), (1.0, 1), (0.25, 1), (0.75, max(1, top - 1)), (0.5, max(1, top - 1))]
    specs, updates = packed_updates(model, shapes, seed=3)
    weights = [3.0, 1.0, 2.0, 5.0, 1.5, 4.0]
    result = aggregate_updates({n: s.shape for n, s in specs.items()}, updates, weights, backend=backend)
    delta, num, den = dense_masked(specs, updates, weights)
    for name in specs:
        assert torch.allclose(result.delta[name].to(torch.float64), delta[name], rtol=1e-6, atol=1e-6), name
    assert torch.allclose(result.div_num, num, rtol=1e-9, atol=1e-6)
    assert torch.allclose(result.div_den, den, rtol=1e-9, atol=1e-6)
    total = sum(math.prod(s.shape) for s in specs.values())
    covered = sum(int((d != 0).sum()) for d in delta.values())  # random updates: a covered mean is never exactly 0
    assert result.covered_fraction == pytest.approx(covered / total)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_parameter_no_client_holds_stays_zero_and_uncovered(backend):
    """Only shallow clients this round: the deeper stages and their exits have no holder, and no entry."""
    model = small_models()["preresnet18"]
    specs, updates = packed_updates(model, [(1.0, 1), (0.5, 2), (0.25, 1)], seed=5)
    held = set().union(*updates)
    assert "layer4.0.conv1.weight" not in held and "linear.weight" not in held and "exit3.linear.weight" not in held
    result = aggregate_updates({n: s.shape for n, s in specs.items()}, updates, [1.0, 2.0, 3.0], backend=backend)
    delta, num, den = dense_masked(specs, updates, [1.0, 2.0, 3.0])
    for name in specs:
        if name not in held:
            assert not result.delta[name].any(), name
        assert torch.allclose(result.delta[name].to(torch.float64), delta[name], rtol=1e-6, atol=1e-6), name
    assert torch.allclose(result.div_num, num, rtol=1e-9, atol=1e-6)


@pytest.mark.parametrize("arch", ["resnet18-scalefl", "preresnet18-scalefl"])
def test_a_scalefl_client_sends_its_sub_models_own_tensors_packed(arch):
    """The packed update's shapes are those of the width-p depth-d sub-model itself (ScaleFL's heads included):
    the layout the wire and the fused kernel read is the model's."""
    model = small_models()[arch]
    for width, depth in [(0.25, 1), (0.5, 2), (0.75, 3), (1.0, 4)]:
        built = type(model)(stages=(4, 8, 8, 16), exits=True, norm=model.norm, exit_head="scalefl", width=width,
                            depth=depth)
        specs, (update,) = packed_updates(model, [(width, depth)], seed=2)
        assert {n: tuple(t.shape) for n, t in update.items()} == {n: tuple(p.shape) for n, p in
                                                                   built.named_parameters()}
        assert f"exit{min(depth, 3)}.conv3.weight" in update and "exit1.att.dw1.weight" not in update


def test_depth_update_is_packed_never_dense():
    """What a depth-1 client at width 1/4 sends: its held tensors' slices, far fewer elements than the model."""
    model = small_models()["preresnet18"]
    specs, (update,) = packed_updates(model, [(0.25, 1)], seed=1)
    sent = sum(t.numel() for t in update.values())
    assert set(update) == {n for n, d in model.param_depths().items() if d == 1}
    assert all(tuple(t.shape) == specs[n].sliced_shape(0.25) for n, t in update.items())
    assert sent < sum(math.prod(s.shape) for s in specs.values()) / 10


@pytest.mark.skipif(not (torch.cuda.is_available() and fused_available("cuda")),
                    reason="needs a CUDA device and hasfl_ray._C built with its CUDA kernel")
@pytest.mark.parametrize("arch", ["preresnet18", "preresnet18-scalefl"])
def test_mixed_widths_and_depths_on_cuda_match_the_dense_masked_definition(arch):
    model = small_models()[arch]
    specs, updates = packed_updates(model, [(1.0, 4), (0.5, 2), (0.25, 1), (0.75, 3)], seed=7)
    weights = [1.0, 2.0, 3.0, 4.0]
    on_gpu = [{n: t.cuda() for n, t in u.items()} for u in updates]
    result = aggregate_updates({n: s.shape for n, s in specs.items()}, on_gpu, weights, backend="fused")
    delta, num, den = dense_masked(specs, updates, weights)
    for name in specs:
        assert torch.allclose(result.delta[name].cpu().to(torch.float64), delta[name], rtol=1e-6, atol=1e-6), name
    assert torch.allclose(result.div_num.cpu(), num, rtol=1e-9, atol=1e-6)
    assert torch.allclose(result.div_den.cpu(), den, rtol=1e-9, atol=1e-6)
