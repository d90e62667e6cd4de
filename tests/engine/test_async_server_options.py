"""FedBuff's server learning rate and momentum, its equal-weight form, and FedAsync's local proximal term ρ
(docs/async.md), each against a transcription of its source's expression:

- Nguyen et al. (AISTATS 2022), Algorithm 1: Δ̄ ← Δ̄ + s(τ_i) Δ_i over K arrivals, then w ← w − η_g Δ̄ / K (their Δ is
  w_start − w_end; hasfl-ray's is w_end − w_start, hence +); their experiments run the server step as SGD with
  momentum, which FLSim's FedBuff (facebookresearch/FLSim ``flsim/optimizers/async_aggregators.py``,
  ``HybridAggregator._update_global_model``: the reduced delta set as the gradient, then ``self.optimizer.step()``,
  a ``torch.optim.SGD`` of lr η_g and momentum β) does: the float64 reference below is that SGD step;
- Xie, Koyejo, Gupta (2019), Algorithm 1: the worker takes local steps on g_{x_τ}(x; z) = f(x; z) + ρ/2 ||x − x_τ||²,
  x_τ the model it received; the reference differentiates that sum with autograd.

The server steps are recomputed by hand from a real run: every server update's inputs (the arrived updates, their
sample counts and staleness) and the model before and after it are captured, and the float64 reference steps from
the captured model with its own momentum buffer."""

import json
import os

import pytest
import torch
from click.testing import CliRunner
from torch.nn import functional as F

from hasfl_ray.algorithms.fullmodel import FedAvg
from hasfl_ray.cli.main import main
from hasfl_ray.data.digits import load_digits_federated
from hasfl_ray.engine import Engine, RunConfig
from hasfl_ray.engine.backend import LocalBackend
from hasfl_ray.engine.checkpoint import load_checkpoint
from hasfl_ray.engine.participants import initial_parameters
from hasfl_ray.engine.server import Server
from hasfl_ray.errors import ConfigError
from hasfl_ray.models import build_model
from hasfl_ray.training.task import ClientTask, OptimizerSettings
from hasfl_ray.training.trainer import Trainer

ASYNC = dict(backend="local", mode="async", devices="lognormal", clients=6, clients_per_round=3, local_epochs=1,
             seed=4, concurrency=3, buffer_size=2, rounds=4, checkpoint_every=0, algorithm="fedavg",
             staleness="polynomial:0.5")
SYNC = dict(mode="sync", concurrency=None, buffer_size=None, devices=None, staleness=None)


def capture(monkeypatch):
    """Every server update of a local run: the model before, the arrived results (updates in float64), the
    arrivals' staleness, and the model after."""
    steps, arrivals = [], []
    original_apply, original_arrived = Server.apply, FedAvg.arrived

    def apply(self, results, weights, server_lr=1.0, bases=None, momentum=0.0):
        before = {n: t.detach().double().clone() for n, t in self.params.items()}
        updates = [({n: t.detach().double().clone() for n, t in r.update.items()}, r.num_samples) for r in results]
        out = original_apply(self, results, weights, server_lr, bases, momentum)
        steps.append((before, updates, {n: t.detach().double().clone() for n, t in self.params.items()}))
        return out

    def arrived(self, version, items):
        arrivals.append([a.staleness for a in items])
        return original_arrived(self, version, items)

    monkeypatch.setattr(Server, "apply", apply)
    monkeypatch.setattr(FedAvg, "arrived", arrived)
    return steps, arrivals


@pytest.mark.parametrize("weighting", ["samples", "count"])
def test_fedbuff_server_steps_with_lr_and_momentum_equal_the_float64_reference(tmp_path, monkeypatch, weighting):
    eta, beta = 0.7, 0.9
    steps, arrivals = capture(monkeypatch)
    Engine(RunConfig(**ASYNC, server_lr=eta, server_momentum=beta, aggregation_weights=weighting),
           out_dir=str(tmp_path / "run")).run()
    assert len(steps) == 4 and len(arrivals) == 4 and max(max(taus) for taus in arrivals) > 0  # some update stale
    momentum = None  # FLSim's server optimizer state: torch.optim.SGD's momentum buffer, float64
    for version, ((before, updates, after), taus) in enumerate(zip(steps, arrivals)):
        w = {n: torch.nn.Parameter(t.clone()) for n, t in before.items()}
        optimizer = torch.optim.SGD(list(w.values()), lr=eta, momentum=beta)
        if momentum is not None:
            for p, buf in zip(w.values(), momentum):
                optimizer.state[p]["momentum_buffer"] = buf.clone()
        factors = [(1.0 + tau) ** -0.5 for tau in taus]
        # Nguyen et al.'s Δ̄ / K = (1/K) Σ s(τ_i) Δ_i (count); with samples the n_i-weighted form Σ n_i s_i Δ_i / Σ n_i
        counts = [1.0 if weighting == "count" else float(n) for _, n in updates]
        means = {}
        for name, p in w.items():
            means[name] = sum(c * s * u[name] for (u, _), c, s in zip(updates, counts, factors)) / sum(counts)
            p.grad = -means[name]  # FLSim's delta is w_start − w_end
        optimizer.step()
        momentum = [optimizer.state[p]["momentum_buffer"].clone() for p in w.values()]
        for name, p in w.items():
            assert torch.allclose(after[name], p.detach(), rtol=1e-5, atol=1e-6), (version, name)
            if version > 0:  # the momentum acts: the step is not η_g times this update's mean alone
                assert not torch.allclose(after[name], before[name] + eta * means[name], rtol=1e-5, atol=1e-6)


def test_the_equal_weight_form_differs_from_the_sample_weighted_one_and_defaults_keep_the_bits(tmp_path):
    plain = Engine(RunConfig(**ASYNC), out_dir=str(tmp_path / "plain")).run()
    explicit = Engine(RunConfig(**ASYNC, server_lr=1.0, server_momentum=0.0, async_rho=0.0,
                                aggregation_weights="samples"), out_dir=str(tmp_path / "explicit")).run()
    equal = Engine(RunConfig(**ASYNC, aggregation_weights="count"), out_dir=str(tmp_path / "equal")).run()
    assert explicit["params_sha256"] == plain["params_sha256"] != equal["params_sha256"]


@pytest.mark.parametrize("cuda_graphs", [False, True])
def test_the_proximal_term_is_xies_local_objective(cuda_graphs):
    """One client's local steps with ``ClientTask.proximal`` ρ against autograd on f(w) + ρ/2 ||w − w_received||²
    (full batches, plain SGD: the order of a batch does not matter). The static-step path (``cuda_graphs``, eager
    on a CPU) must not drop the term: a client with ρ trains eagerly."""
    dataset = load_digits_federated(6, 0.3, 3)
    n = dataset.client_size(0)
    settings = OptimizerSettings(momentum=0.0, weight_decay=0.0, clip_norm=0.0, local_epochs=1, batch_size=4096,
                                 local_steps=4)
    trainer = Trainer(dataset, "digits", settings, cuda_graphs=cuda_graphs)
    start = initial_parameters("digits", 3)
    lr, rho = 0.1, 2.0
    got = trainer.train(ClientTask(0, 0, 1.0, lr, 3, proximal=rho), start).update
    plain = trainer.train(ClientTask(0, 0, 1.0, lr, 3), start).update
    model = build_model("digits").double()
    received = {k: v.double() for k, v in start.items()}
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(received[name])
    x, y = dataset.client_batch(0, torch.arange(n))
    model.train()
    for _ in range(4):
        model.zero_grad()
        prox = sum((p - received[name]).square().sum() for name, p in model.named_parameters())
        (F.cross_entropy(model(x.double()), y) + rho / 2 * prox).backward()
        with torch.no_grad():
            for p in model.parameters():
                p -= lr * p.grad
    for name, p in model.named_parameters():
        expected = p.detach() - received[name]
        assert torch.allclose(got[name].double(), expected, rtol=0, atol=5e-7), name  # float32 rounding
    assert any(not torch.allclose(got[k], plain[k]) for k in got)  # ρ pulled the client back


def test_every_asynchronous_client_carries_rho(tmp_path, monkeypatch):
    tasks = []
    original = LocalBackend.dispatch

    def dispatch(self, task):
        tasks.append(task.proximal)
        return original(self, task)

    monkeypatch.setattr(LocalBackend, "dispatch", dispatch)
    config = RunConfig(**{**ASYNC, "algorithm": "heterofl", "async_rule": "fedasync", "buffer_size": None,
                          "async_rho": 0.5})
    summary = Engine(config, out_dir=str(tmp_path / "rho")).run()
    assert tasks and set(tasks) == {0.5}
    plain = Engine(RunConfig(**{**ASYNC, "algorithm": "heterofl", "async_rule": "fedasync", "buffer_size": None}),
                   out_dir=str(tmp_path / "plain")).run()
    assert summary["params_sha256"] != plain["params_sha256"]


def lines(run_dir):
    with open(os.path.join(run_dir, "metrics.jsonl"), encoding="utf-8") as handle:
        return [{k: v for k, v in json.loads(line).items() if k != "wall_s"} for line in handle]


def test_resume_keeps_the_server_momentum_buffer(tmp_path, monkeypatch, crash_async_at):
    config = RunConfig(**{**ASYNC, "rounds": 7, "checkpoint_every": 2, "server_lr": 0.8, "server_momentum": 0.9,
                          "aggregation_weights": "count", "async_rho": 0.1})
    reference = Engine(config, out_dir=str(tmp_path / "reference")).run()
    crash_async_at(5)
    with pytest.raises(KeyboardInterrupt):
        Engine(config, out_dir=str(tmp_path / "run")).run()
    monkeypatch.undo()
    saved = load_checkpoint(str(tmp_path / "run"))
    assert saved.round == 4 and saved.clock["async"]["server_momentum"] is not None
    resumed = Engine(config, out_dir=str(tmp_path / "run"), resume=True).run()
    assert resumed["params_sha256"] == reference["params_sha256"]
    assert lines(tmp_path / "run") == lines(tmp_path / "reference")


@pytest.mark.parametrize("values, words", [
    (dict(server_lr=-0.5), "server_lr is -0.5; expected a number > 0 and at most 1000 (the server learning rate)"),
    (dict(server_lr=0), "server_lr is 0; expected a number > 0"),
    (dict(server_momentum=1.0), "server_momentum is 1.0; expected a number in [0, 1)"),
    (dict(server_momentum=-0.1), "server_momentum is -0.1; expected a number in [0, 1)"),
    (dict(async_rho=-1.0), "async_rho is -1.0; expected a number >= 0"),
    (dict(async_rho=float("nan")), "async_rho is nan; expected a number >= 0"),
    (dict(async_rule="fedasync", buffer_size=None, server_lr=0.5), "server_lr is 0.5 but async_rule is 'fedasync'; "
                                                                   "expected it only with fedbuff"),
    (dict(async_rule="fedasync", buffer_size=None, server_momentum=0.9), "server_momentum is 0.9 but async_rule is "
                                                                         "'fedasync'"),
    # (server_lr and server_momentum are the server optimiser's in sync mode too: tests/engine/test_server_optimizers.py)
    (dict(SYNC, server_lr=-0.5), "server_lr is -0.5; expected a number > 0"),
    (dict(SYNC, async_rho=0.5),
     "async_rho is 0.5 but mode is 'sync'"),
    (dict(aggregation_weights="equal"), "aggregation_weights is 'equal'; expected samples (n_i) or count"),
])
def test_bad_values_are_one_sentence(values, words):
    with pytest.raises(ConfigError) as error:
        RunConfig(**{**ASYNC, **values})
    assert words in str(error.value)
    assert str(error.value).count(". ") == 0 and "\n" not in str(error.value)


@pytest.mark.parametrize("flags, words", [
    (["--mode", "async", "--devices", "lognormal", "--server-momentum", "1"], "server_momentum is 1.0"),
    (["--mode", "async", "--devices", "lognormal", "--async-rho", "-2"], "async_rho is -2.0"),
    (["--server-lr", "0"], "server_lr is 0.0; expected a number > 0"),
    (["--aggregation-weights", "equal"], "'equal' is not one of 'samples', 'count'"),
])
def test_bad_values_exit_2_at_the_cli(tmp_path, flags, words):
    result = CliRunner().invoke(main, ["simulate", "--backend", "local", "--quiet", "--out", str(tmp_path / "run"),
                                       *flags])
    assert result.exit_code == 2 and words in result.output and "Traceback" not in result.output
    assert not os.path.exists(tmp_path / "run")
