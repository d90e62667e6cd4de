"""FedBuff's and FedAsync's server rules (docs/algorithms.md, "Asynchronous servers") on width-sliced updates:
the fused kernel's weighted mean with the staleness-scaled weights and the step of
:mod:`hasfl_ray.aggregation.asynchronous`, and the server's FedAsync mixing, against float64 pure-torch oracles
written from the papers' equations, on random inputs."""

import numpy as np
import pytest
import torch

from hasfl_ray.aggregation import aggregate_updates
from hasfl_ray.aggregation.asynchronous import buffered_step, mixing_step
from hasfl_ray.config.asynchronous import parse_staleness, staleness_factor
from hasfl_ray.data.digits import load_digits_federated
from hasfl_ray.engine.participants import initial_parameters
from hasfl_ray.engine.server import Server
from hasfl_ray.models import build_model
from hasfl_ray.models.slicing import window_linear_index
from hasfl_ray.training.result import ClientResult

SHAPES = {"a.weight": (6, 5), "a.bias": (6,), "b.weight": (3, 6, 2)}


def random_buffer(seed):
    g = torch.Generator().manual_seed(seed)
    k = int(torch.randint(1, 6, (1,), generator=g))
    updates, masks = [], []
    for _ in range(k):
        update, mask = {}, {}
        for name, shape in SHAPES.items():
            if torch.rand(1, generator=g) < 0.2:
                continue  # this client did not train that parameter
            packed = tuple(int(torch.randint(1, s + 1, (1,), generator=g)) for s in shape)
            update[name] = torch.randn(packed, generator=g, dtype=torch.float64).to(torch.float32)
            m = torch.zeros(shape, dtype=torch.bool)
            m[tuple(slice(0, s) for s in packed)] = True
            mask[name] = m
        if not update:
            update["a.bias"] = torch.randn(6, generator=g).to(torch.float32)
            mask["a.bias"] = torch.ones(6, dtype=torch.bool)
        updates.append(update)
        masks.append(mask)
    counts = (torch.randint(1, 50, (k,), generator=g)).tolist()
    taus = torch.randint(0, 12, (k,), generator=g).tolist()
    return updates, masks, counts, taus


@pytest.mark.parametrize("staleness", ["polynomial:0.5", "polynomial:1.7", "hinge:0.3,2", "constant"])
@pytest.mark.parametrize("seed", range(12))
def test_fedbuff_step_equals_the_float64_oracle(seed, staleness):
    updates, masks, counts, taus = random_buffer(seed)
    kind, params = parse_staleness(staleness)
    factors = [staleness_factor(kind, params, tau) for tau in taus]
    server_lr = 0.7
    weights, step = buffered_step(counts, factors, server_lr)
    aggregate = aggregate_updates(SHAPES, updates, weights, backend="fused")
    for name, shape in SHAPES.items():
        # the oracle: per coordinate, the n_i s(τ_i)-weighted mean of the covering updates, times
        # η_g Σ n_i s(τ_i) / Σ n_i (FedBuff's (1/K) Σ s(τ_i) Δ_i where all cover it with equal n_i)
        num = torch.zeros(shape, dtype=torch.float64)
        den = torch.zeros(shape, dtype=torch.float64)
        for update, mask, n, s in zip(updates, masks, counts, factors):
            if name in update:
                full = torch.zeros(shape, dtype=torch.float64)
                full[mask[name]] = update[name].to(torch.float64).flatten()
                num += n * s * full
                den += n * s * mask[name]
        mean = torch.where(den > 0, num / torch.where(den > 0, den, 1), 0)
        expected = server_lr * sum(n * s for n, s in zip(counts, factors)) / sum(counts) * mean
        got = step * aggregate.delta[name].to(torch.float64)
        assert torch.allclose(got, expected, rtol=1e-6, atol=1e-7), name


def test_fedbuff_with_equal_samples_and_full_coverage_is_the_papers_rule():
    """Nguyen et al. (2022), Algorithm 1: Δ̄ = (1/K) Σ_i s(τ_i) Δ_i, w ← w + η_g Δ̄ (here as an ascent on −Δ)."""
    g = torch.Generator().manual_seed(3)
    updates = [{"w": torch.randn(4, 3, generator=g)} for _ in range(5)]
    taus = [0, 1, 3, 7, 2]
    factors = [1 / np.sqrt(1 + tau) for tau in taus]
    weights, step = buffered_step([10] * 5, factors, 1.0)
    delta = step * aggregate_updates({"w": (4, 3)}, updates, weights).delta["w"].double()
    paper = sum(s * u["w"].double() for s, u in zip(factors, updates)) / 5
    assert torch.allclose(delta, paper, atol=1e-6)


@pytest.fixture(scope="module")
def digits():
    return load_digits_federated(6, 0.3, 3)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("offset", [0, 3])
def test_fedasync_mixing_equals_the_float64_oracle(digits, seed, offset):
    """Xie et al. (2019): x_t = (1 − α_t) x_{t−1} + α_t x_new with α_t = α s(t − τ), x_new = w_stale + Δ on the
    client's coordinates (its leading slice, or its rolling window at ``offset``), the model unchanged elsewhere."""
    g = torch.Generator().manual_seed(seed)
    specs = build_model("digits").param_specs()
    start = initial_parameters("digits", seed)
    server = Server("digits", start, digits, 500, "auto", "cpu")
    server.keep_version(0)  # the client starts from version 0
    stale = {n: t.clone().double() for n, t in server.params.items()}
    drift = {n: 0.01 * torch.randn(spec.shape, generator=g) for n, spec in specs.items()}  # later updates
    server.set_params({n: server.params[n] + drift[n] for n in specs})
    current = {n: t.clone().double() for n, t in server.params.items()}
    width = [0.25, 0.5, 1.0][seed % 3]
    delta = {n: 0.1 * torch.randn(spec.sliced_shape(width), generator=g) for n, spec in specs.items()}
    result = ClientResult(0, width, delta, 30, 0.1, 1, offset=offset)
    tau, alpha = 4, 0.6
    factor = staleness_factor("polynomial", (0.5,), tau)
    weights, step = mixing_step(30, factor, alpha, 1.0)
    server.apply([result], weights, step, bases=[0])
    a = alpha * factor
    for name, spec in specs.items():
        expected = current[name].clone()
        shape = spec.sliced_shape(width)
        index = window_linear_index(spec, shape, offset).flatten()
        mixed = (1 - a) * current[name].flatten()[index] + a * (stale[name].flatten()[index] +
                                                                 delta[name].double().flatten())
        expected.view(-1)[index] = mixed
        assert torch.allclose(server.params[name].double(), expected, atol=2e-6), name
    server.release_version(0)
    assert server.kept_versions() == {}
