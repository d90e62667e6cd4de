"""--precision bf16 (hasfl_ray.training.precision): bfloat16 autocast around local training's forward and loss.

fp32 (the default) is the code path of every earlier version (the config's default, no autocast); bf16 changes the
update by bfloat16 rounding only, keeps float32 weights and updates, is the same through the static (graphed) step
and with --client-batching on or mixed (those clients train one at a time), resumes bit for bit, and a resume
that changes the precision is refused. Local == Ray with bf16 is tests/simulation/test_ray_precision.py.
"""

import dataclasses

import pytest
import torch

from hasfl_ray.engine import Engine, RunConfig
from hasfl_ray.engine.checkpoint import config_differences
from hasfl_ray.errors import ConfigError
from hasfl_ray.models import build_model
from hasfl_ray.training.local import ClientTask, OptimizerSettings, Trainer
from hasfl_ray.training.precision import cpu_runs_bf16_lstm, forward_precision
from tests.training.test_graphed import assert_identical, image_dataset, text_dataset

FP32 = OptimizerSettings(momentum=0.9, weight_decay=1e-4, clip_norm=1.0, local_epochs=2, batch_size=8)
BF16 = dataclasses.replace(FP32, precision="bf16")
SMALL = dict(backend="local", clients=6, clients_per_round=3, seed=5)


def initial(model, seed=0):
    torch.manual_seed(seed)
    return {k: v.detach().clone() for k, v in build_model(model).named_parameters()}


def relative_gap(a, b):
    return float(torch.linalg.vector_norm(a - b) / torch.linalg.vector_norm(a))


def test_fp32_is_the_default_and_runs_without_autocast():
    assert RunConfig().precision == "fp32" and OptimizerSettings().precision == "fp32"
    with forward_precision(torch.device("cpu"), "fp32"):
        assert not torch.is_autocast_enabled("cpu")
        assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.float32
    with forward_precision(torch.device("cpu"), "bf16"):
        assert torch.is_autocast_enabled("cpu")
        assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.bfloat16


_BF16_LSTM = pytest.mark.skipif(not cpu_runs_bf16_lstm(),
                                reason="needs a CPU with AVX-512: oneDNN has no bf16 LSTM without it (a Zen 3, "
                                       "2026-11-29: 'could not create a primitive descriptor for the LSTM forward "
                                       "propagation primitive')")


@pytest.mark.parametrize("model, dataset, bound", [("digits", image_dataset, 0.15),
                                                  pytest.param("shakespeare", text_dataset, 0.02, marks=_BF16_LSTM)])
def test_bf16_changes_the_update_by_bfloat16_rounding_and_keeps_float32(model, dataset, bound):
    """One local step from the same start: the whole update within ``bound`` relative L2 of fp32's (the digits
    CNN's BatchNorm at batch 8 on random pixels amplifies bfloat16's 2^-8 rounding; the LSTM's gap is 3e-3)."""
    data, params = dataset(), initial(model)
    task = ClientTask(0, 0, 1.0, 0.1, 3)
    one_step = dataclasses.replace(FP32, local_steps=1)
    exact = Trainer(data, model, one_step).train(task, params)
    rounded = Trainer(data, model, dataclasses.replace(one_step, precision="bf16")).train(task, params)
    assert all(rounded.update[name].dtype == torch.float32 == update.dtype for name, update in exact.update.items())
    whole = [torch.cat([result.update[name].flatten() for name in exact.update]) for result in (exact, rounded)]
    gap = relative_gap(*whole)
    assert 0 < gap < bound  # the arithmetic changed (autocast ran), by rounding, not by training something else
    assert abs(rounded.loss - exact.loss) < 0.01 * abs(exact.loss)
    # the trainer's cached network keeps float32 weights (the master copy)
    assert all(p.dtype == torch.float32 for p in Trainer(data, model, BF16).model_at(1.0).parameters())


def test_bf16_through_the_static_step_equals_eager_bf16_bit_for_bit():
    data, params = image_dataset(), initial("digits")
    eager, static = Trainer(data, "digits", BF16), Trainer(data, "digits", BF16, cuda_graphs=True)
    for client in range(4):
        task = ClientTask(client, 1, 0.5, 0.2, 7)
        assert_identical(eager.train(task, params), static.train(task, params))
    assert static.steps.built == 1  # the static step did run


@pytest.mark.parametrize("batching", ["on", "mixed"])
def test_bf16_with_client_batching_trains_one_at_a_time(batching):
    data, params = image_dataset(), initial("digits")
    trainer = Trainer(data, "digits", BF16)
    tasks = [ClientTask(c, 0, w, 0.2, 9) for c, w in enumerate((0.5, 0.5, 1.0, 0.5))]
    grouped = trainer.train_group(tasks, params, batching=batching)
    for task, result in zip(tasks, grouped):
        assert_identical(trainer.train(task, params), result)


def test_bf16_is_recorded_and_resumes_bit_for_bit_and_another_precision_is_refused(tmp_path):
    config = RunConfig(rounds=3, checkpoint_every=1, precision="bf16", **SMALL)
    reference = Engine(config, out_dir=str(tmp_path / "reference")).run()
    assert "precision: bf16" in (tmp_path / "reference" / "config.yaml").read_text()
    fp32 = Engine(dataclasses.replace(config, precision="fp32"), out_dir=str(tmp_path / "fp32")).run()
    assert fp32["params_sha256"] != reference["params_sha256"]

    crashed = Engine(config, out_dir=str(tmp_path / "run"))
    run_round = crashed.run_round

    def crash_in_round_2(t):
        if t == 2:
            raise KeyboardInterrupt
        return run_round(t)

    crashed.run_round = crash_in_round_2
    with pytest.raises(KeyboardInterrupt):
        crashed.run()
    with pytest.raises(ConfigError, match=r"precision 'bf16' -> 'fp32'"):
        Engine(dataclasses.replace(config, precision="fp32"), out_dir=str(tmp_path / "run"), resume=True).prepare()
    resumed = Engine(config, out_dir=str(tmp_path / "run"), resume=True).run()
    assert resumed["params_sha256"] == reference["params_sha256"]


def test_a_config_written_before_the_key_counts_as_fp32():
    stored = RunConfig(**SMALL).to_dict()
    del stored["precision"]
    assert config_differences(stored, RunConfig(**SMALL)) == []
    assert config_differences(stored, RunConfig(precision="bf16", **SMALL)) == ["precision 'fp32' -> 'bf16'"]


def test_an_unknown_precision_is_one_sentence():
    with pytest.raises(ConfigError, match=r"^precision is 'fp16'; expected fp32 or bf16"):
        RunConfig(precision="fp16")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("model, dataset", [("digits", image_dataset), ("shakespeare", text_dataset)])
def test_bf16_graphed_equals_bf16_eager_on_cuda_bit_for_bit(model, dataset):
    """The captured step runs autocast without its weight-cast cache (what a capture needs); the replays give the
    eager bf16 step's values bit for bit, and the step was captured, not run eagerly after a failed capture."""
    from hasfl_ray.training.determinism import apply_determinism

    apply_determinism(True)
    params = initial(model)
    eager = Trainer(dataset(), model, BF16, "cuda")
    graphed = Trainer(dataset(), model, BF16, "cuda", cuda_graphs=True)
    for client in range(4):
        task = ClientTask(client, 1, 0.5, 0.2, 7)
        assert_identical(eager.train(task, params), graphed.train(task, params))
    (step,) = graphed.steps._steps.values()
    assert step.captured


def test_why_batching_stays_off_under_bf16_torch_funcs_batchnorm_backward_refuses_autocasts_dtypes():
    """The reason --client-batching trains one at a time under bf16 (docs/gpu.md): the batched path's
    vmap(grad_and_value(loss)) of a BatchNorm network under bfloat16 autocast raises in BatchNorm's backward. If a
    torch release lifts this, batching under bf16 is worth measuring again against one-at-a-time bf16."""
    from torch.func import functional_call, grad_and_value, vmap
    from torch.nn import functional as F

    model = build_model("digits")
    params = {k: torch.stack([v.detach()] * 2) for k, v in model.named_parameters()}
    x, y = torch.randn(2, 4, 1, 8, 8), torch.randint(0, 10, (2, 4))

    def loss(p, xb, yb):
        with forward_precision(torch.device("cpu"), "bf16"):
            return F.cross_entropy(functional_call(model, p, (xb,)), yb)

    vmap(grad_and_value(lambda p, xb, yb: F.cross_entropy(functional_call(model, p, (xb,)), yb)))(params, x, y)
    with pytest.raises(RuntimeError, match="BFloat16"):
        vmap(grad_and_value(loss))(params, x, y)
