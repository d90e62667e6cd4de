"""The server optimisers in real runs (docs/algorithms.md, "Server optimisers"): every step of a synchronous HAS-FL
run (width-sliced updates, so coordinates go uncovered) and of an asynchronous FedBuff run against a float64
transcription of Reddi et al.'s Algorithm 2 (tests/aggregation/test_server_optim.py has the unit test and Flower's
strategies), resumes bit for bit, the default sgd keeps every bit, and bad values are one sentence (exit 2)."""

import json
import os

import pytest
import torch
from click.testing import CliRunner

from hasfl_ray.cli.main import main
from hasfl_ray.engine import Engine, RunConfig
from hasfl_ray.engine import server as server_module
from hasfl_ray.engine.checkpoint import load_checkpoint
from hasfl_ray.engine.server import Server
from hasfl_ray.errors import ConfigError

SYNC = dict(backend="local", rounds=4, clients=6, clients_per_round=3, local_epochs=1, seed=3, warmup=1, t_adapt=1,
            checkpoint_every=0, algorithm="hasfl")
ASYNC = dict(backend="local", mode="async", devices="lognormal", clients=6, clients_per_round=3, local_epochs=1,
             seed=4, concurrency=3, buffer_size=2, rounds=4, checkpoint_every=0, algorithm="hasfl", warmup=1,
             t_adapt=1)


def capture(monkeypatch):
    """Every server step of a run: the model before, the aggregate Δ̄ and scale it was given, the packed shapes of the
    accepted updates (whose leading slices are the coordinates covered), and the model after."""
    steps = []
    original_apply, original_update = Server.apply, server_module.server_update

    def apply(self, results, *args, **kwargs):
        before = {n: t.detach().double().clone() for n, t in self.params.items()}
        finite = [r for r in results if not r.non_finite()]
        shapes = [{n: tuple(t.shape) for n, t in r.update.items()} for r in finite]
        out = original_apply(self, results, *args, **kwargs)
        steps[-1].update(before=before, shapes=shapes, after={n: t.detach().double().clone()
                                                              for n, t in self.params.items()})
        return out

    def update(optimizer, params, delta, step_lr, state, covered):
        steps.append(dict(delta={n: t.detach().double().clone() for n, t in delta.items()}, scale=step_lr,
                          optimizer=optimizer))
        return original_update(optimizer, params, delta, step_lr, state, covered)

    monkeypatch.setattr(Server, "apply", apply)
    monkeypatch.setattr(server_module, "server_update", update)
    return steps


def covered(shape, packed_shapes):
    """The union of the leading slices ``packed_shapes`` of a parameter of ``shape`` (no gate blocks in these
    models), computed apart from the engine's ones-aggregation."""
    mask = torch.zeros(shape, dtype=torch.bool)
    for packed in packed_shapes:
        mask[tuple(slice(0, s) for s in packed)] = True
    return mask


def reference_steps(name, eta, beta1, beta2, tau, steps):
    """Algorithm 2 in float64 from the run's first model, over its sequence of aggregated updates: x, m, v unchanged
    where no client covered (the documented choice)."""
    x = {n: t.clone() for n, t in steps[0]["before"].items()}
    m = {n: torch.zeros_like(t) for n, t in x.items()}
    v = {n: torch.zeros_like(t) for n, t in x.items()}
    for step in steps:
        for n in x:
            mask = covered(x[n].shape, [s[n] for s in step["shapes"] if n in s])
            d = step["delta"][n] * step["scale"]
            m_new = beta1 * m[n] + (1 - beta1) * d
            if name == "fedadagrad":
                v_new = v[n] + d * d
            elif name == "fedyogi":
                v_new = v[n] - (1 - beta2) * d * d * torch.sign(v[n] - d * d)
            else:
                v_new = beta2 * v[n] + (1 - beta2) * d * d
            x[n] = torch.where(mask, x[n] + eta * m_new / (v_new.sqrt() + tau), x[n])
            m[n], v[n] = torch.where(mask, m_new, m[n]), torch.where(mask, v_new, v[n])
    return x


FEDASYNC = {**ASYNC, "async_rule": "fedasync", "buffer_size": None}


@pytest.mark.parametrize("name, base", [("fedadam", SYNC), ("fedyogi", SYNC), ("fedadagrad", SYNC),
                                        ("fedadam", ASYNC), ("fedyogi", FEDASYNC)],
                         ids=["sync-fedadam", "sync-fedyogi", "sync-fedadagrad", "fedbuff-fedadam", "fedasync-fedyogi"])
def test_every_server_step_of_a_run_is_algorithm_2(tmp_path, monkeypatch, name, base):
    steps = capture(monkeypatch)
    config = RunConfig(**base, server_optimizer=name, server_tau=1e-3)
    Engine(config, out_dir=str(tmp_path / "run")).run()
    assert len(steps) == 4 and all(s["optimizer"].name == name for s in steps)
    assert any(not covered(t.shape, [s[n] for s in steps[1]["shapes"] if n in s]).all()
               for n, t in steps[1]["before"].items())  # some coordinates uncovered: the masks matter
    want = reference_steps(name, config.server_lr, config.server_beta1, config.server_beta2 or 0.0, 1e-3, steps)
    for n, t in steps[-1]["after"].items():
        assert torch.allclose(t, want[n], rtol=1e-4, atol=1e-6), n
    # what the run did is not the sgd step
    plain = Engine(RunConfig(**base), out_dir=str(tmp_path / "plain")).run()
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["params_sha256"] != plain["params_sha256"]


def test_sgd_given_explicitly_keeps_the_default_bits(tmp_path):
    plain = Engine(RunConfig(**{**SYNC, "checkpoint_every": 2}), out_dir=str(tmp_path / "plain")).run()
    explicit = Engine(RunConfig(**SYNC, server_optimizer="sgd", server_lr=1.0, server_momentum=0.0),
                      out_dir=str(tmp_path / "explicit")).run()
    no_momentum = Engine(RunConfig(**SYNC, server_optimizer="fedavgm", server_momentum=0.0),
                         out_dir=str(tmp_path / "fedavgm0")).run()
    assert plain["params_sha256"] == explicit["params_sha256"] == no_momentum["params_sha256"]
    assert load_checkpoint(str(tmp_path / "plain")).server_state is None  # nothing more in its checkpoint


def lines(run_dir):
    with open(os.path.join(run_dir, "metrics.jsonl"), encoding="utf-8") as handle:
        return [{k: v for k, v in json.loads(line).items() if k != "wall_s"} for line in handle]


@pytest.mark.parametrize("optimizer", [dict(server_optimizer="fedadam"), dict(server_optimizer="fedavgm")])
def test_a_synchronous_run_resumes_bit_for_bit_with_its_moments(tmp_path, optimizer):
    flags = ["simulate", "--backend", "local", "--rounds", "4", "--clients", "6", "--clients-per-round", "3",
             "--checkpoint-every", "1", "--quiet", "--server-optimizer", optimizer["server_optimizer"]]
    whole = CliRunner().invoke(main, flags + ["--out", str(tmp_path / "whole")])
    assert whole.exit_code == 0, whole.output
    out = tmp_path / "run"
    crashed = CliRunner().invoke(main, flags + ["--fault-inject", "trainer-error@2", "--out", str(out)])
    assert crashed.exit_code == 1 and "injected trainer failure" in crashed.output, crashed.output
    state = load_checkpoint(str(out)).server_state
    assert state is not None and set(state) >= {"m"} and (optimizer["server_optimizer"] != "fedadam" or "v" in state)
    resumed = CliRunner().invoke(main, ["simulate", "--out", str(out), "--resume", "--quiet"])
    assert resumed.exit_code == 0, resumed.output
    sha = [json.loads((d / "summary.json").read_text())["params_sha256"] for d in (tmp_path / "whole", out)]
    assert sha[0] == sha[1] and lines(out) == lines(tmp_path / "whole")


def test_an_asynchronous_run_resumes_bit_for_bit_with_its_moments(tmp_path, monkeypatch, crash_async_at):
    config = RunConfig(**{**ASYNC, "rounds": 7, "checkpoint_every": 2, "server_optimizer": "fedadam"})
    reference = Engine(config, out_dir=str(tmp_path / "reference")).run()
    crash_async_at(5)
    with pytest.raises(KeyboardInterrupt):
        Engine(config, out_dir=str(tmp_path / "run")).run()
    monkeypatch.undo()
    saved = load_checkpoint(str(tmp_path / "run")).clock["async"]["server_momentum"]
    assert set(saved) == {"m", "v"}
    resumed = Engine(config, out_dir=str(tmp_path / "run"), resume=True).run()
    assert resumed["params_sha256"] == reference["params_sha256"]
    assert lines(tmp_path / "run") == lines(tmp_path / "reference")


@pytest.mark.parametrize("values, words", [
    (dict(server_optimizer="adam"), "server_optimizer is 'adam'; expected sgd (w + eta Delta, the default), fedavgm, "
                                    "fedadam, fedyogi or fedadagrad"),
    (dict(server_optimizer="fedadam", server_momentum=0.9), "server_momentum is 0.9 but server_optimizer is "
                                                             "'fedadam'; expected it only with sgd or fedavgm"),
    (dict(server_beta1=0.9), "server_beta1 is 0.9 but server_optimizer is 'sgd'; expected it only with fedadam"),
    (dict(server_optimizer="fedavgm", server_tau=0.1), "server_tau is 0.1 but server_optimizer is 'fedavgm'"),
    (dict(server_optimizer="fedadagrad", server_beta2=0.9), "server_beta2 is 0.9 but server_optimizer is "
                                                             "'fedadagrad'; expected it only with fedadam or fedyogi"),
    (dict(server_optimizer="fedyogi", server_tau=0.0), "server_tau is 0.0; expected a number > 0"),
    (dict(server_optimizer="fedadam", server_beta1=1.0), "server_beta1 is 1.0; expected a number in [0, 1)"),
    (dict(server_optimizer="fedadam", server_beta2=float("nan")), "server_beta2 is nan; expected a number in [0, 1)"),
    (dict(server_optimizer="fedadam", server_lr=0.0), "server_lr is 0.0; expected a number > 0"),
    (dict(server_momentum=1.0), "server_momentum is 1.0; expected a number in [0, 1)"),
    (dict(ASYNC, async_rule="fedasync", buffer_size=None, server_optimizer="fedavgm"),
     "server_optimizer is 'fedavgm' but async_rule is 'fedasync'"),
])
def test_bad_values_are_one_sentence(values, words):
    with pytest.raises(ConfigError) as error:
        RunConfig(**{**SYNC, **values})
    assert words in str(error.value)
    assert str(error.value).count(". ") == 0 and "\n" not in str(error.value)


@pytest.mark.parametrize("flags, words", [
    (["--server-optimizer", "adamw"], "server_optimizer is 'adamw'"),
    (["--server-optimizer", "fedyogi", "--server-beta2", "1.5"], "server_beta2 is 1.5; expected a number in [0, 1)"),
    (["--server-beta1", "0.9"], "server_beta1 is 0.9 but server_optimizer is 'sgd'"),
    (["--server-tau", "-1", "--server-optimizer", "fedadam"], "server_tau is -1.0; expected a number > 0"),
])
def test_bad_values_exit_2_at_the_cli(tmp_path, flags, words):
    result = CliRunner().invoke(main, ["simulate", "--backend", "local", "--quiet", "--out", str(tmp_path / "run"),
                                       *flags])
    assert result.exit_code == 2 and words in result.output and "Traceback" not in result.output
    assert not os.path.exists(tmp_path / "run")
