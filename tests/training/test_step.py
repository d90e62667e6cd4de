"""LocalSGD (hasfl_ray.training.step) is clip_grad_norm_ + torch.optim.SGD, bit for bit, on every model kind; its
stacked twin StackedSGD steps each of C stacked clients as LocalSGD steps that client alone."""

from __future__ import annotations

import pytest
import torch
from torch.nn import functional as F

from hasfl_ray.models import build_model
from hasfl_ray.training.step import LocalSGD, StackedSGD


def batches(name: str, count: int, generator: torch.Generator):
    if name == "shakespeare":
        return [(torch.randint(0, 80, (6, 20), generator=generator), torch.randint(0, 80, (6,), generator=generator))
                for _ in range(count)]
    shape = {"synthetic": (60,), "digits": (1, 8, 8), "emnist": (1, 28, 28)}[name]
    classes = {"synthetic": 10, "digits": 10, "emnist": 62}[name]
    return [(torch.randn(8, *shape, generator=generator) * 3, torch.randint(0, classes, (8,), generator=generator))
            for _ in range(count)]


def train(name: str, width: float, use_local_sgd: bool, settings: dict, data) -> dict:
    torch.manual_seed(0)
    model = build_model(name, width)
    model.train()
    params = list(model.parameters())
    if use_local_sgd:
        optimizer = LocalSGD(params, **settings)
    else:
        optimizer = torch.optim.SGD(params, lr=settings["lr"], momentum=settings["momentum"],
                                    weight_decay=settings["weight_decay"])
    for x, y in data:
        optimizer.zero_grad()
        F.cross_entropy(model(x), y).backward()
        if not use_local_sgd and settings["clip_norm"] > 0:
            torch.nn.utils.clip_grad_norm_(params, settings["clip_norm"])
        optimizer.step()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("name,width", [("synthetic", 1.0), ("digits", 0.5), ("emnist", 0.25), ("shakespeare", 0.5)])
@pytest.mark.parametrize("settings", [
    dict(lr=0.05, momentum=0.9, weight_decay=1e-4, clip_norm=10.0),
    dict(lr=0.5, momentum=0.9, weight_decay=1e-4, clip_norm=0.05),  # the clip binds on every step
    dict(lr=0.1, momentum=0.0, weight_decay=0.0, clip_norm=0.0),
])
def test_local_sgd_is_torch_sgd_with_clipping_bit_for_bit(name, width, settings):
    data = batches(name, 4, torch.Generator().manual_seed(1))
    ours = train(name, width, True, settings, data)
    theirs = train(name, width, False, settings, data)
    start = {k: v for k, v in build_model(name, width).state_dict().items()}
    assert any(not torch.equal(ours[k], start[k]) for k in ours if ours[k].is_floating_point())  # it trained
    for key in theirs:
        assert torch.equal(ours[key], theirs[key]), key


def test_parameters_without_gradient_are_left_alone_as_torch_does():
    a, b = torch.nn.Parameter(torch.ones(3)), torch.nn.Parameter(torch.ones(2))
    optimizer = LocalSGD([a, b], lr=0.1, momentum=0.9, weight_decay=0.1, clip_norm=1.0)
    (a * torch.tensor([1.0, 2.0, 3.0])).sum().backward()
    optimizer.step()
    assert torch.equal(b.detach(), torch.ones(2)) and optimizer.buffers[1] is None
    assert not torch.equal(a.detach(), torch.ones(3)) and optimizer.buffers[0] is not None


def test_zero_buffers_give_the_same_steps():
    data = batches("synthetic", 3, torch.Generator().manual_seed(2))
    results = []
    for zero in (False, True):
        torch.manual_seed(0)
        model = build_model("synthetic")
        optimizer = LocalSGD(list(model.parameters()), 0.05, 0.9, 1e-4, 10.0, zero_buffers=zero)
        for x, y in data:
            optimizer.zero_grad()
            F.cross_entropy(model(x), y).backward()
            optimizer.step()
        results.append(torch.cat([p.detach().flatten() for p in model.parameters()]))
    assert torch.equal(results[0], results[1])


@pytest.mark.parametrize("settings", [
    dict(momentum=0.9, weight_decay=1e-4, clip_norm=0.05),  # the clip binds
    dict(momentum=0.9, weight_decay=0.0, clip_norm=10.0),
    dict(momentum=0.0, weight_decay=1e-4, clip_norm=0.0),
])
@pytest.mark.parametrize("lrs", [[0.1, 0.1, 0.1], [0.1, 0.05, 0.2]])
def test_stacked_sgd_steps_each_client_as_local_sgd_does(settings, lrs):
    """Three clients, four steps fed the same gradients: every client in steps 0, 1 and 3, a sub-stack of clients 0
    and 2 in step 2 (client 1 has no batch there); each client's parameters as LocalSGD's of that client alone, to
    float rounding (the stacked norms reduce in another order)."""
    generator = torch.Generator().manual_seed(3)
    shapes = [(4, 3), (5,), (2, 2, 3)]
    start = [torch.randn(3, *shape, generator=generator) for shape in shapes]
    members = [[0, 1, 2], [0, 1, 2], [0, 2], [0, 1, 2]]
    grads = [[torch.randn(len(m), *shape, generator=generator) for shape in shapes] for m in members]

    stacked = [t.clone() for t in start]
    optimizer = StackedSGD(stacked, lrs, **settings)
    for k, clients in enumerate(members):
        index = None if len(clients) == 3 else torch.tensor(clients)
        sub = [t if index is None else t.index_select(0, index) for t in stacked]
        optimizer.step(sub, [g.clone() for g in grads[k]], index, first=k == 0)
        if index is not None:
            for t, s in zip(stacked, sub):
                t.index_copy_(0, index, s)

    for c in range(3):
        params = [torch.nn.Parameter(t[c].clone()) for t in start]
        alone = LocalSGD(params, lrs[c], **settings)
        for k, clients in enumerate(members):
            if c in clients:
                for p, g in zip(params, grads[k]):
                    p.grad = g[clients.index(c)].clone()
                alone.step()
        assert not torch.equal(params[0].detach(), start[0][c])  # it trained
        for p, t in zip(params, stacked):
            torch.testing.assert_close(t[c], p.detach(), rtol=1e-6, atol=1e-7)
