"""A whole local step on static tensors (hasfl_ray.training.graphed, --cuda-graphs).

On CPU the static-buffer step runs eagerly (the sequence a CUDA graph captures) and must equal Trainer.train without
it bit for bit: the LSTM, the BatchNorm CNN and the MLP, short last batches, several clients in a row on one cached
step (momentum buffers and loss sum reset per client), objectives that must not be graphed falling back to the
eager loop. The CUDA tests (skipped here: "needs CUDA") check captured graphs against eager CUDA training.
"""

import os

import pytest
import torch
from click.testing import CliRunner

from hasfl_ray.algorithms.fjord import OrderedDropoutObjective
from hasfl_ray.algorithms.fullmodel import ControlVariateObjective, ProximalObjective
from hasfl_ray.cli.main import main
from hasfl_ray.data.base import TensorFederatedDataset, TextFederatedDataset
from hasfl_ray.engine import Engine, RunConfig
from hasfl_ray.engine.checkpoint import config_differences
from hasfl_ray.errors import ConfigError
from hasfl_ray.models import build_model
from hasfl_ray.training.graphed import MAX_STEPS, StepCache
from hasfl_ray.training.local import ClientTask, LocalObjective, OptimizerSettings, Trainer, graphable

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

#: Client sizes: batches of 8 leave short last batches (7, 3, 1 = skipped after the first step), one client
#: smaller than a batch (never graphed: no batch of the static shape), and an empty client.
SIZES = [31, 16, 19, 25, 5, 0]


def text_dataset(sizes=SIZES):
    generator = torch.Generator().manual_seed(1)
    stream = torch.randint(0, 95, (3000,), dtype=torch.uint8, generator=generator)
    starts = [torch.randint(0, 3000 - 81, (n,), generator=generator) for n in sizes]
    return TextFederatedDataset("shakespeare", "shakespeare", 95, stream, starts, torch.arange(5),
                                [f"c{i}" for i in range(len(sizes))], 80)


def image_dataset(sizes=SIZES):
    generator = torch.Generator().manual_seed(2)
    n = sum(sizes)
    x = torch.randint(0, 256, (n, 1, 8, 8), dtype=torch.uint8, generator=generator)
    y = torch.randint(0, 10, (n,), generator=generator)
    return TensorFederatedDataset("digits", "digits", 10, x, y, x[:8], y[:8], list(torch.arange(n).split(sizes)),
                                  mean=[0.5], std=[0.25])


def vector_dataset(sizes=SIZES):
    generator = torch.Generator().manual_seed(3)
    n = sum(sizes)
    x = torch.randn(n, 60, generator=generator) * 2
    y = torch.randint(0, 10, (n,), generator=generator)
    return TensorFederatedDataset("synthetic", "synthetic", 10, x, y, x[:8], y[:8], list(torch.arange(n).split(sizes)))


DATASETS = {"shakespeare": text_dataset, "digits": image_dataset, "synthetic": vector_dataset}
SETTINGS = OptimizerSettings(momentum=0.9, weight_decay=1e-4, clip_norm=1.0, local_epochs=2, batch_size=8)


def initial(model, seed=0):
    torch.manual_seed(seed)
    return {k: v.detach().clone() for k, v in build_model(model).named_parameters()}


def assert_identical(reference, got):
    assert (got.client, got.width, got.steps, got.num_samples) == \
        (reference.client, reference.width, reference.steps, reference.num_samples)
    assert got.loss == reference.loss  # the float64 loss sum, exactly
    for name, update in reference.update.items():
        assert torch.equal(got.update[name], update), name


# -- CPU: the eager static-buffer mode is Trainer.train, bit for bit ----------------------------------------------


@pytest.mark.parametrize("model", ["shakespeare", "digits", "synthetic"])
def test_static_step_equals_trainer_train_bit_for_bit_with_ragged_clients(model):
    dataset, params = DATASETS[model](), initial(model)
    eager = Trainer(dataset, model, SETTINGS)
    static = Trainer(dataset, model, SETTINGS, cuda_graphs=True)
    assert static.steps is not None and not static.steps.capture  # CPU: the same sequence, not captured
    tasks = [ClientTask(c, 2, 0.5, 0.3, 11) for c in range(len(SIZES))]
    for task in tasks:  # clients in a row on one cached step: buffers and loss sum start afresh per client
        assert_identical(eager.train(task, params), static.train(task, params))
    assert static.steps.built == 1 and len(static.steps) == 1
    # again in another order (the cached step's buffers hold the previous client's state when a client starts)
    for task in reversed(tasks):
        assert_identical(eager.train(task, params), static.train(task, params))
    assert static.steps.built == 1


@pytest.mark.parametrize("settings", [
    OptimizerSettings(momentum=0.0, weight_decay=0.0, clip_norm=0.0, local_epochs=1, batch_size=8),
    OptimizerSettings(momentum=0.9, weight_decay=1e-4, clip_norm=0.01, local_epochs=1, batch_size=5),  # clip binds
])
def test_static_step_equals_trainer_train_without_momentum_or_with_a_binding_clip(settings):
    dataset, params = text_dataset(), initial("shakespeare")
    eager, static = Trainer(dataset, "shakespeare", settings), Trainer(dataset, "shakespeare", settings,
                                                                        cuda_graphs=True)
    for task in [ClientTask(c, 0, 0.25, 0.5, 3) for c in range(4)]:
        assert_identical(eager.train(task, params), static.train(task, params))


def test_widths_and_learning_rates_key_the_cache_and_a_new_learning_rate_replaces_the_old():
    dataset, params = vector_dataset(), initial("synthetic")
    trainer = Trainer(dataset, "synthetic", SETTINGS, cuda_graphs=True)
    reference = Trainer(dataset, "synthetic", SETTINGS)
    for width, lr in ((0.5, 0.1), (1.0, 0.1), (0.5, 0.1), (0.5, 0.05), (1.0, 0.05)):
        task = ClientTask(0, 0, width, lr, 5)
        assert_identical(reference.train(task, params), trainer.train(task, params))
    assert trainer.steps.built == 4 and len(trainer.steps) == 2  # (0.5, 0.1) reused; the 0.1 entries replaced
    trainer.release(keep=[1.0])
    assert len(trainer.steps) == 1 and trainer.cached_widths == [1.0]


def test_the_cache_keeps_at_most_max_steps_entries():
    dataset = vector_dataset([40])
    trainer = Trainer(dataset, "synthetic", SETTINGS)
    cache = StepCache(capture=False, max_steps=3)
    x, y = dataset.client_batch(0, torch.arange(8))
    for width in (0.25, 0.5, 0.75, 1.0):
        cache.get(trainer.model_at(width), width, x, y, 0.1, SETTINGS)
    assert len(cache) == 3 and cache.built == 4
    assert MAX_STEPS >= 4  # a round's widths (the paper's four tiers) fit


def test_a_failed_capture_restores_the_parameters_trains_eagerly_and_is_not_tried_again(monkeypatch, caplog):
    """A capture that fails after the warm-up (an op that synchronises with the host, say): CPU stand-ins for the
    CUDA stream calls let the warm-up run for real, then the capture raises as CUDA does."""
    import contextlib

    class Stream:
        def wait_stream(self, other):
            pass

    attempts = []

    def failing_graph(graph, stream=None):
        attempts.append(1)
        raise RuntimeError("CUDA error: operation not permitted when stream is capturing")

    monkeypatch.setattr(torch.cuda, "Stream", lambda device=None: Stream())
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: Stream())
    monkeypatch.setattr(torch.cuda, "stream", lambda stream: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "CUDAGraph", lambda: object())
    monkeypatch.setattr(torch.cuda, "graph", failing_graph)
    dataset, params = text_dataset(), initial("shakespeare")
    reference = Trainer(dataset, "shakespeare", SETTINGS)
    trainer = Trainer(dataset, "shakespeare", SETTINGS, cuda_graphs=True)
    trainer.steps.capture = True  # as on CUDA
    for lr in (0.3, 0.2):  # a new round's learning rate: a new entry, not captured again
        for task in [ClientTask(c, 2, 0.5, lr, 11) for c in range(3)]:
            assert_identical(reference.train(task, params), trainer.train(task, params))
    assert len(attempts) == 1 and trainer.steps.built == 2
    assert all(not step.captured for step in trainer.steps._steps.values())
    assert sum("CUDA graph capture" in record.message for record in caplog.records) == 1


class FinishOnly(LocalObjective):
    def finish(self, model, initial, steps, lr):
        return {"steps_seen": steps}


class OwnLoss(LocalObjective):
    def loss(self, model, x, y):
        return super().loss(model, x, y) * 1.0


def test_only_the_default_loss_without_gradient_adjustment_is_graphed():
    shapes = {name: tuple(spec.sliced_shape(0.5)) for name, spec in build_model("synthetic").param_specs().items()}
    assert graphable(LocalObjective()) and graphable(FinishOnly())
    assert not graphable(ProximalObjective(0.5))
    assert not graphable(ControlVariateObjective({n: torch.zeros(s) for n, s in shapes.items()}))
    assert not graphable(ControlVariateObjective(None))
    assert not graphable(OrderedDropoutObjective([0.25, 0.5], 1.0, 0))
    assert not graphable(OwnLoss())


def test_fedprox_scaffold_and_fjord_fall_back_to_the_eager_loop():
    dataset, params = vector_dataset(), initial("synthetic")
    eager = Trainer(dataset, "synthetic", SETTINGS)
    static = Trainer(dataset, "synthetic", SETTINGS, cuda_graphs=True)
    shapes = {name: tuple(spec.sliced_shape(0.5)) for name, spec in static.specs.items()}
    correction = {n: 0.01 * torch.randn(s, generator=torch.Generator().manual_seed(4)) for n, s in shapes.items()}
    makers = [lambda: ProximalObjective(0.5), lambda: ControlVariateObjective(correction),
              lambda: OrderedDropoutObjective([0.25, 0.5], 1.0, 7), lambda: OwnLoss()]
    for make in makers:
        task = lambda: ClientTask(0, 1, 0.5, 0.2, 9, make())  # noqa: E731 (a fresh objective per training)
        assert_identical(eager.train(task(), params), static.train(task(), params))
    assert static.steps.built == 0  # none of them touched the static step
    result = static.train(ClientTask(0, 1, 0.5, 0.2, 9, FinishOnly()), params)
    assert static.steps.built == 1 and result.extras == {"steps_seen": result.steps}


def test_batched_groups_take_precedence_and_single_clients_use_the_static_step():
    dataset, params = image_dataset(), initial("digits")
    trainer = Trainer(dataset, "digits", SETTINGS, cuda_graphs=True)
    reference = Trainer(dataset, "digits", SETTINGS)
    tasks = [ClientTask(0, 0, 0.5, 0.1, 1), ClientTask(1, 0, 0.5, 0.1, 1), ClientTask(2, 0, 1.0, 0.1, 1)]
    results = trainer.train_group(tasks, params)
    assert trainer.steps.built == 1  # the lone width-1.0 client; the two width-0.5 clients were batched
    assert_identical(reference.train(tasks[2], params), results[2])


def test_the_ray_trainer_actor_passes_the_setting_on():
    pytest.importorskip("ray", reason="needs Ray")
    from hasfl_ray.simulation.actors import TrainerActor

    dataset, params = vector_dataset(), initial("synthetic")
    actor = TrainerActor(dataset, "synthetic", SETTINGS, "cpu", 1, True, True)
    plain = TrainerActor(dataset, "synthetic", SETTINGS, "cpu", 1)
    assert actor.trainer.steps is not None and plain.trainer.steps is None
    from hasfl_ray.simulation.wire import unpack

    task = ClientTask(0, 0, 0.5, 0.1, 1)
    [graphed] = unpack(actor.run(params, [([task], False)])[1])
    [eager] = unpack(plain.run(params, [([task], False)])[1])
    assert_identical(eager, graphed)


# -- the config and the command line -------------------------------------------------------------------------------

RUN = dict(rounds=2, clients=6, clients_per_round=3, seed=3, warmup=1, t_adapt=1, backend="local", local_epochs=1)


def test_auto_resolves_by_device_and_a_bad_value_is_one_sentence():
    assert RunConfig(backend="local", device="cpu").resolved().cuda_graphs == "off"
    assert RunConfig(backend="local", device="cuda").resolved().cuda_graphs == "on"
    assert RunConfig(backend="local", device="cuda:1").resolved().cuda_graphs == "on"
    assert RunConfig(backend="local", device="cpu", cuda_graphs="on").resolved().cuda_graphs == "on"
    assert RunConfig(backend="local", device="cuda", cuda_graphs="off").resolved().cuda_graphs == "off"
    with pytest.raises(ConfigError, match=r"^cuda_graphs is 'sometimes'; expected auto, on or off$"):
        RunConfig(backend="local", cuda_graphs="sometimes")
    with pytest.raises(ConfigError, match=r"^cuda_graphs is True; expected auto, on or off$"):
        RunConfig(backend="local", cuda_graphs=True)


def test_a_run_written_before_the_option_existed_resumes_as_off():
    stored = RunConfig(**RUN, device="cpu").resolved().to_dict()
    del stored["cuda_graphs"]
    assert config_differences(stored, RunConfig(**RUN, device="cpu").resolved()) == []
    assert config_differences(stored, RunConfig(**RUN, device="cpu", cuda_graphs="on").resolved()) == \
        ["cuda_graphs 'off' -> 'on'"]


def test_on_with_a_cpu_device_gives_the_same_run_and_is_recorded(tmp_path):
    shas = {}
    for mode in ("off", "on"):
        out = tmp_path / mode
        result = CliRunner().invoke(main, ["simulate", "--backend", "local", "--device", "cpu", "--rounds", "2",
                                           "--clients", "6", "--clients-per-round", "3", "--cuda-graphs", mode,
                                           "--quiet", "--out", str(out)])
        assert result.exit_code == 0, result.output
        assert f"cuda_graphs: '{mode}'" in (out / "config.yaml").read_text()
        shas[mode] = (out / "summary.json").read_text().split('"params_sha256": "')[1][:64]
    assert shas["on"] == shas["off"]


def test_a_bad_mode_at_the_command_line_is_exit_2(tmp_path):
    out = tmp_path / "run"
    result = CliRunner().invoke(main, ["simulate", "--backend", "local", "--cuda-graphs", "always", "--quiet",
                                       "--out", str(out)])
    assert result.exit_code == 2
    assert "cuda_graphs is 'always'; expected auto, on or off" in result.output
    assert "Traceback" not in result.output and not os.path.exists(out)


# -- CUDA: captured graphs against eager CUDA training ------------------------------------------------------------


@pytest.fixture
def deterministic_cuda():
    from hasfl_ray.training.determinism import apply_determinism

    apply_determinism(True)
    return torch.device("cuda")


@needs_cuda
@pytest.mark.parametrize("model", ["shakespeare", "digits", "synthetic"])
def test_graphed_equals_eager_on_cuda_bit_for_bit_and_reuses_one_graph(deterministic_cuda, model):
    dataset, params = DATASETS[model](), initial(model)
    eager = Trainer(dataset, model, SETTINGS, "cuda")
    graphed = Trainer(DATASETS[model](), model, SETTINGS, "cuda", cuda_graphs=True)
    assert graphed.steps.capture
    tasks = [ClientTask(c, 2, 0.5, 0.3, 11) for c in range(len(SIZES))]
    for task in tasks + tasks[::-1]:
        assert_identical(eager.train(task, params), graphed.train(task, params))
    assert graphed.steps.built == 1
    (step,) = graphed.steps._steps.values()
    assert step.captured  # the step was captured, not run eagerly after a failed capture


@needs_cuda
def test_graphed_cuda_runs_repeat_bit_for_bit_and_match_eager(deterministic_cuda, tmp_path):
    shas = []
    for name, mode in (("a", "on"), ("b", "on"), ("c", "off")):
        config = RunConfig(**RUN, device="cuda", client_batching="off", cuda_graphs=mode)
        shas.append(Engine(config, out_dir=str(tmp_path / name)).run()["params_sha256"])
    assert shas[0] == shas[1] == shas[2]
