"""The server optimisers (hasfl_ray/aggregation/server_optim.py) against a float64 transcription of Reddi et al.,
"Adaptive Federated Optimization" (ICLR 2021), Algorithm 2, on a fixed sequence of aggregated updates with width
masks, and against Flower's strategies where flwr is importable.

The equations and defaults were checked against Flower's sources as read with this project's ``read_file`` (one
stored version each): adap/flower ``src/py/flwr/server/strategy/fedadam.py`` at
18638bc758665120e91e6f3071e65367da83b297 (η 0.1, β1 0.9, β2 0.99, τ 1e-9, no bias correction), ``fedyogi.py`` at
05c252a9929bed5e0450a8d542e43f78d5c999de (η 0.01, τ 1e-3; v − (1 − β2) Δ² sign(v − Δ²)), ``fedadagrad.py`` at
187f8253cef32ea0fb3ea3a4e6162594c08bb4ab (β1 fixed at 0, v + Δ²) and ``fedavgm.py`` at
05c252a9929bed5e0450a8d542e43f78d5c999de (m ← β m + pseudo-gradient, x ← x − η m: the heavy ball). m and v start at 0
in each. Flower 1.42.0's FedAdam multiplies η by Adam's bias correction √(1 − β2^(t+1)) / (1 − β1^(t+1)) (t its
round, from 1), which the paper's Algorithm 2 has not: the comparison with it passes that η for each step. Flower's
FedAvgM is compared too (its heavy ball, on the masked sequence: FedAvgM applies its momentum everywhere).
"""

import numpy as np
import pytest
import torch

from hasfl_ray.aggregation.server_optim import DEFAULTS, ServerOptimizer, as_state, server_update

SHAPES = {"w": (4, 3), "b": (4,)}
STEPS = 6


def sequence(seed=0):
    """A fixed sequence of aggregated updates Δ_t (0 where uncovered) and their coverage masks: the first rows
    covered every step, the last row of ``w`` and entry 3 of ``b`` only every other step (a width-3/4 client alone
    in the odd rounds), and ``b`` not at all in step 2."""
    generator = torch.Generator().manual_seed(seed)
    out = []
    for t in range(STEPS):
        masks = {name: torch.ones(shape, dtype=torch.bool) for name, shape in SHAPES.items()}
        if t % 2:
            masks["w"][3] = False
            masks["b"][3] = False
        if t == 2:
            masks["b"][:] = False
        deltas = {name: torch.randn(shape, generator=generator, dtype=torch.float64) * 0.1 * masks[name]
                  for name, shape in SHAPES.items()}
        if t == 4:
            deltas["w"][0, 0] = 0.0  # covered, but a zero update: its moments move (decay), unlike uncovered ones
        out.append((deltas, masks))
    return out


def reference(name, lr, beta1, beta2, tau, x0, steps, momentum=0.0):
    """Algorithm 2 in float64 numpy, coordinate by coordinate; a coordinate not covered keeps x, m, v (the
    documented choice). fedavgm: m ← β m + η Δ, x ← x + m everywhere (the heavy ball, FedBuff's)."""
    x = {k: v.numpy().copy() for k, v in x0.items()}
    m = {k: np.zeros_like(v) for k, v in x.items()}
    v = {k: np.zeros_like(val) for k, val in x.items()}
    for deltas, masks in steps:
        for key in x:
            d, mask = deltas[key].numpy(), masks[key].numpy()
            if name in ("sgd", "fedavgm"):
                m[key] = momentum * m[key] + lr * d
                x[key] = x[key] + m[key]
                continue
            it = np.nditer(d, flags=["multi_index"])
            for _ in it:
                j = it.multi_index
                if not mask[j]:
                    continue
                m[key][j] = beta1 * m[key][j] + (1 - beta1) * d[j]
                if name == "fedadagrad":
                    v[key][j] = v[key][j] + d[j] ** 2
                elif name == "fedyogi":
                    v[key][j] = v[key][j] - (1 - beta2) * d[j] ** 2 * np.sign(v[key][j] - d[j] ** 2)
                else:
                    v[key][j] = beta2 * v[key][j] + (1 - beta2) * d[j] ** 2
                x[key][j] = x[key][j] + lr * m[key][j] / (np.sqrt(v[key][j]) + tau)
    return x, m, v


def run_engine(optimizer, x0, steps, dtype=torch.float64, state=None):
    x = {k: t.to(dtype).clone() for k, t in x0.items()}
    for deltas, masks in steps:
        updated, state = server_update(optimizer, x, {k: d.to(dtype) for k, d in deltas.items()},
                                       optimizer.step_lr(1.0, None), state, lambda: masks)
        x.update(updated)
    return x, state


def start():
    generator = torch.Generator().manual_seed(7)
    return {name: torch.randn(shape, generator=generator, dtype=torch.float64) for name, shape in SHAPES.items()}


@pytest.mark.parametrize("name", ["fedadam", "fedyogi", "fedadagrad"])
def test_adaptive_optimisers_equal_the_float64_reference_with_width_masks(name):
    eta, beta1, beta2, tau = DEFAULTS[name]
    tau = 1e-3  # a τ that matters next to √v (1e-9 makes every step ±η once v ~ Δ²)
    optimizer = ServerOptimizer(name, eta, 0.0, beta1, beta2 or 0.0, tau)
    x0, steps = start(), sequence()
    want, m, v = reference(name, eta, beta1, beta2 or 0.0, tau, x0, steps)
    got, state = run_engine(optimizer, x0, steps)
    for key in SHAPES:
        np.testing.assert_allclose(got[key].numpy(), want[key], rtol=1e-12, atol=1e-15)
        np.testing.assert_allclose(state["m"][key].numpy(), m[key], rtol=1e-12, atol=1e-15)
        np.testing.assert_allclose(state["v"][key].numpy(), v[key], rtol=1e-12, atol=1e-15)
    # the engine's float32 parameters follow the float64 equations to float32's precision
    got32, _ = run_engine(optimizer, x0, steps, torch.float32)
    for key in SHAPES:
        np.testing.assert_allclose(got32[key].double().numpy(), want[key], rtol=2e-5, atol=2e-6)
    # the moves are real: each step moved x (not the sgd step)
    plain, _ = run_engine(ServerOptimizer(), x0, steps)
    assert not torch.allclose(plain["w"], got["w"])


def test_uncovered_coordinates_keep_their_parameter_and_moments():
    optimizer = ServerOptimizer("fedadam", 0.1, 0.0, 0.9, 0.99, 1e-3)
    x0, steps = start(), sequence()
    x, state = run_engine(optimizer, x0, steps[:1])
    m1, v1 = {k: t.clone() for k, t in state["m"].items()}, {k: t.clone() for k, t in state["v"].items()}
    x2, state = run_engine(optimizer, x, steps[1:2], state=state)  # step 1: w's row 3 and b[3] uncovered
    assert torch.equal(x2["w"][3], x["w"][3]) and torch.equal(x2["b"][3], x["b"][3])
    assert torch.equal(state["m"]["w"][3], m1["w"][3]) and torch.equal(state["v"]["w"][3], v1["w"][3])
    assert not torch.equal(x2["w"][:3], x["w"][:3]) and not torch.equal(state["m"]["w"][:3], m1["w"][:3])


def test_fedavgm_is_the_heavy_ball_step_fedbuff_took():
    x0, steps = start(), sequence()
    want, _, _ = reference("fedavgm", 0.7, 0, 0, 0, x0, steps, momentum=0.9)
    optimizer = ServerOptimizer("fedavgm", momentum=0.9)
    x = {k: t.clone() for k, t in x0.items()}
    state = None
    for deltas, masks in steps:
        updated, state = server_update(optimizer, x, deltas, optimizer.step_lr(1.0, 0.7), state, lambda: masks)
        x.update(updated)
    for key in SHAPES:
        np.testing.assert_allclose(x[key].numpy(), want[key], rtol=1e-12, atol=1e-15)
    # a FedBuff checkpoint's flat momentum buffer reads as the state's m
    assert as_state({"w": torch.ones(2)})["m"]["w"].tolist() == [1.0, 1.0]


def flower_strategy(kind, x0, **kwargs):
    flwr = pytest.importorskip("flwr", reason="flwr is not installed in this environment (pip install flwr; "
                               "benchmarks/server_optim_vs_flower.py runs the same comparison from a Flower venv)")
    from flwr.common import Code, FitRes, Status, ndarrays_to_parameters
    from flwr.server.strategy import FedAdagrad, FedAdam, FedYogi

    strategy = {"fedadam": FedAdam, "fedyogi": FedYogi, "fedadagrad": FedAdagrad}[kind](
        initial_parameters=ndarrays_to_parameters([x0[k].numpy() for k in SHAPES]), **kwargs)

    def step(server_round, current, delta):
        params = ndarrays_to_parameters([current[k] + delta[k] for k in SHAPES])
        fit = FitRes(status=Status(code=Code.OK, message=""), parameters=params, num_examples=1, metrics={})
        out, _ = strategy.aggregate_fit(server_round, [(None, fit)], [])
        from flwr.common import parameters_to_ndarrays
        return dict(zip(SHAPES, parameters_to_ndarrays(out)))

    return flwr, step


@pytest.mark.parametrize("kind", ["fedadam", "fedyogi", "fedadagrad"])
def test_flowers_strategies_on_the_same_sequence(kind):
    x0 = start()
    eta, beta1, beta2, tau = DEFAULTS[kind]
    tau = 1e-3
    kwargs = dict(eta=eta, tau=tau) if kind == "fedadagrad" else dict(eta=eta, beta_1=beta1, beta_2=beta2, tau=tau)
    flwr, step = flower_strategy(kind, x0, **kwargs)
    bias_corrected = kind == "fedadam" and "eta_norm" in open(
        __import__("flwr.server.strategy.fedadam", fromlist=["x"]).__file__, encoding="utf-8").read()
    steps = [(deltas, {k: torch.ones(s, dtype=torch.bool) for k, s in SHAPES.items()}) for deltas, _ in sequence()]
    flower = {k: x0[k].numpy().copy() for k in SHAPES}
    ours, state = {k: t.clone() for k, t in x0.items()}, None
    for t, (deltas, masks) in enumerate(steps, start=1):
        flower_before = flower
        flower = step(t, flower, {k: d.numpy() for k, d in deltas.items()})
        # Flower's Δ_t is (x + Δ) − x in float64: ours takes the same numbers
        delta = {k: torch.from_numpy(flower_before[k] + deltas[k].numpy() - flower_before[k]) for k in SHAPES}
        lr = eta * np.sqrt(1 - beta2 ** (t + 1)) / (1 - beta1 ** (t + 1)) if bias_corrected else eta
        optimizer = ServerOptimizer(kind, lr, 0.0, beta1, beta2 or 0.0, tau)
        updated, state = server_update(optimizer, ours, delta, 1.0, state, lambda: masks)
        ours.update(updated)
        for k in SHAPES:
            np.testing.assert_allclose(ours[k].numpy(), flower[k], rtol=1e-12, atol=1e-14, err_msg=f"{kind} {t} {k}")
    assert flwr.__version__


def test_flowers_fedavgm_on_the_same_sequence():
    pytest.importorskip("flwr", reason="flwr is not installed in this environment (pip install flwr; "
                        "benchmarks/server_optim_vs_flower.py runs the FedAdam/FedYogi/FedAdagrad comparison)")
    from flwr.common import Code, FitRes, Status, ndarrays_to_parameters, parameters_to_ndarrays
    from flwr.server.strategy import FedAvgM

    x0, eta, beta = start(), 0.7, 0.9
    strategy = FedAvgM(initial_parameters=ndarrays_to_parameters([x0[k].numpy() for k in SHAPES]),
                       server_learning_rate=eta, server_momentum=beta)
    optimizer = ServerOptimizer("fedavgm", momentum=beta)
    flower = {k: x0[k].numpy().copy() for k in SHAPES}
    ours, state = {k: t.clone() for k, t in x0.items()}, None
    for t, (deltas, masks) in enumerate(sequence(), start=1):
        params = ndarrays_to_parameters([flower[k] + deltas[k].numpy() for k in SHAPES])
        fit = FitRes(status=Status(code=Code.OK, message=""), parameters=params, num_examples=1, metrics={})
        before = flower
        flower = dict(zip(SHAPES, parameters_to_ndarrays(strategy.aggregate_fit(t, [(None, fit)], [])[0])))
        delta = {k: torch.from_numpy(before[k] + deltas[k].numpy() - before[k]) for k in SHAPES}
        updated, state = server_update(optimizer, ours, delta, optimizer.step_lr(1.0, eta), state, lambda: masks)
        ours.update(updated)
        for k in SHAPES:  # Flower's m' = β m' + (x − x_new), x ← x − η m' is ours with m = −η m'
            np.testing.assert_allclose(ours[k].numpy(), flower[k], rtol=1e-12, atol=1e-14, err_msg=f"{t} {k}")
