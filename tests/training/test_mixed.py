"""Mixed-width batched training (--client-batching mixed, issue 39 item 5): clients of several widths trained as
one stack padded to the widest equal one-at-a-time training (a float64 oracle to 1e-10, float32 to rounding) for
every kind of batchable objective, ragged clients included; bit-identical run to run; the grouping keeps models
whose forward depends on the width apart; runs agree with --client-batching off."""

import pytest
import torch

import hasfl_ray.training.batched as batched_module
import hasfl_ray.training.eager as eager_module
from hasfl_ray.algorithms import ALGORITHMS, algorithm_class
from hasfl_ray.errors import ConfigError
from hasfl_ray.algorithms.fjord import OrderedDropoutObjective
from hasfl_ray.algorithms.fullmodel import SCAFFOLD_DRIFT, ControlVariateObjective, ProximalObjective
from hasfl_ray.data.base import TensorFederatedDataset, TextFederatedDataset
from hasfl_ray.engine import Engine, RunConfig
from hasfl_ray.models import build_model, build_model_from, pads_exactly, register_model
from hasfl_ray.training.batched import MAX_GROUP, group_tasks, train_batched
from hasfl_ray.training.local import ClientTask, LocalObjective, OptimizerSettings, Trainer
from hasfl_ray.training.mixed import Padding, train_mixed

#: The kinds of objective a batchable algorithm trains with: plain cross-entropy (fedavg, heterofl, hasfl, uniform,
#: random-budget), plain in rolling windows (fedrolex), FedProx's proximal term, SCAFFOLD's correction.
OBJECTIVES = ["plain", "fedrolex", "fedprox", "scaffold"]


class DoubleImages(TensorFederatedDataset):
    """The image set's batches in float64 (the float64 oracle's inputs)."""

    def client_batch(self, client, positions):
        x, y = super().client_batch(client, positions)
        return x.double(), y


def image_dataset(name, sizes, shape, classes, double):
    torch.manual_seed(0)
    n = sum(sizes)
    x = torch.randint(0, 256, (n, *shape), dtype=torch.uint8)
    y = torch.randint(0, classes, (n,))
    kind = DoubleImages if double else TensorFederatedDataset
    return kind(name, name, classes, x, y, x[:8], y[:8], list(torch.arange(n).split(sizes)),
                mean=[0.5] * shape[0], std=[0.25] * shape[0])


def text_dataset(sizes):
    torch.manual_seed(1)
    stream = torch.randint(0, 95, (1500,), dtype=torch.uint8)
    starts = [torch.randint(0, 1500 - 81, (n,)) for n in sizes]
    return TextFederatedDataset("shakespeare", "shakespeare", 95, stream, starts, torch.arange(5),
                                [f"c{i}" for i in range(len(sizes))], 80)


def synthetic_dataset(sizes, double):
    torch.manual_seed(2)
    n = sum(sizes)
    x = torch.randn(n, 60, dtype=torch.float64 if double else torch.float32)
    y = torch.randint(0, 10, (n,))
    return TensorFederatedDataset("synthetic", "synthetic", 10, x, y, x[:8], y[:8], list(torch.arange(n).split(sizes)))


#: model -> (client sizes: short last batches, a 1-sample batch skipped after the first step, an empty client; the
#: widths cycled over the clients, at least 3; local epochs; batch size).
CASES = {
    "emnist": ([21, 16, 9, 5, 1, 0], [0.25, 0.125, 0.0625], 2, 8),
    "shakespeare": ([13, 10, 4, 7], [0.125, 0.0625, 0.25], 1, 5),
    "synthetic": ([45, 32, 17, 9, 3, 1, 0], [1.0, 0.5, 0.25, 0.75], 2, 8),
}


def setting(model, double):
    sizes, widths, epochs, batch = CASES[model]
    if model == "emnist":
        dataset = image_dataset("emnist", sizes, (1, 28, 28), 62, double)
    elif model == "shakespeare":
        dataset = text_dataset(sizes)
    else:
        dataset = synthetic_dataset(sizes, double)
    settings = OptimizerSettings(momentum=0.9, weight_decay=1e-4, clip_norm=1.0, local_epochs=epochs,
                                 batch_size=batch)
    trainer = Trainer(dataset, model, settings)
    params = {k: v.detach().clone() for k, v in build_model(model).named_parameters()}
    return trainer, params, [widths[c % len(widths)] for c in range(len(sizes))]


def make_tasks(trainer, widths, objective):
    tasks = []
    for c, width in enumerate(widths):
        if objective == "fedprox":
            made = ProximalObjective(0.5)
        elif objective == "scaffold":  # c − c_i in the client's own packed shapes
            generator = torch.Generator().manual_seed(c)
            made = ControlVariateObjective({n: 0.01 * torch.randn(spec.sliced_shape(width), generator=generator,
                                                                  dtype=torch.get_default_dtype())
                                            for n, spec in trainer.specs.items()})
        else:
            made = LocalObjective()
        tasks.append(ClientTask(c, 3, width, 0.05, 7, made, offset=(2 * c + 1) if objective == "fedrolex" else 0))
    return tasks


@pytest.fixture
def float64(monkeypatch):
    """Models and parameters in float64, and updates kept in float64 (the server's float32 cast would hide the
    agreement below float32's rounding)."""
    def keep_dtype(trained, initial):
        return {name: (trained[name].detach() - start).to("cpu").contiguous() for name, start in initial.items()}

    monkeypatch.setattr(eager_module, "packed_update", keep_dtype)
    monkeypatch.setattr(batched_module, "packed_update", keep_dtype)
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(default)


def gap(got, want, floor):
    return float((got - want).norm()) / max(float(want.norm()), floor)


def assert_agree(reference, mixed, update_tolerance, loss_tolerance, floor):
    for ref, got in zip(reference, mixed):
        assert (got.client, got.width, got.offset, got.steps, got.num_samples) == \
            (ref.client, ref.width, ref.offset, ref.steps, ref.num_samples)
        assert got.loss == pytest.approx(ref.loss, rel=loss_tolerance, abs=loss_tolerance)
        assert got.update.keys() == ref.update.keys()
        for name, update in ref.update.items():
            assert got.update[name].shape == update.shape and got.update[name].dtype == update.dtype
            # relative to the update's scale, at least ``floor``: an update is only as precise as the parameter it
            # moves (BatchNorm weights near 1 moved by 1e-5), and conv biases before BatchNorm have no gradient in
            # exact arithmetic, only weight decay
            assert gap(got.update[name], update, floor) <= update_tolerance, (ref.client, ref.width, name)
        if SCAFFOLD_DRIFT in ref.extras:
            for name, drift in ref.extras[SCAFFOLD_DRIFT].items():  # float32 by the objective, in either mode
                assert gap(got.extras[SCAFFOLD_DRIFT][name], drift, 1e-3) <= max(update_tolerance, 1e-6), name


def identical(one, two):
    return all(a.loss == b.loss and a.steps == b.steps and all(torch.equal(a.update[n], b.update[n]) for n in a.update)
               and all(torch.equal(a.extras[SCAFFOLD_DRIFT][n], b.extras[SCAFFOLD_DRIFT][n])
                       for n in a.extras.get(SCAFFOLD_DRIFT, {})) for a, b in zip(one, two))


@pytest.mark.parametrize("objective", OBJECTIVES)
@pytest.mark.parametrize("model", list(CASES))
def test_mixed_widths_equal_one_at_a_time_in_float64(float64, model, objective):
    trainer, params, widths = setting(model, double=True)
    assert params[next(iter(params))].dtype == torch.float64 and len(set(widths)) >= 3
    tasks = make_tasks(trainer, widths, objective)
    reference = [trainer.train(task, params) for task in tasks]
    assert reference[0].update[next(iter(params))].dtype == torch.float64
    assert len({r.steps for r in reference}) >= 3 and min(r.steps for r in reference) <= 1  # ragged
    mixed = train_mixed(trainer, tasks, params)
    assert_agree(reference, mixed, update_tolerance=1e-10, loss_tolerance=1e-12, floor=1e-6)
    assert identical(mixed, train_mixed(trainer, tasks, params))  # bit-identical run to run


@pytest.mark.parametrize("objective", OBJECTIVES)
@pytest.mark.parametrize("model", list(CASES))
def test_mixed_widths_equal_one_at_a_time_in_float32(model, objective):
    trainer, params, widths = setting(model, double=False)
    tasks = make_tasks(trainer, widths, objective)
    reference = [trainer.train(task, params) for task in tasks]
    mixed = trainer.train_group(tasks, params, batching="mixed")
    # The stacked convolutions and the one-client ones are different problems to cuDNN and to oneDNN, free to use
    # different algorithms and summation orders: on an H100 the EMNIST losses parted by 6e-5 relative after 2 epochs
    # (issue 39), and on the CPU of the H200 machine of 2026-11-29 by 5.9e-5 and 6.6e-5 (plain, FedProx; 1e-5 held on
    # the AMD EPYC sandboxes), while the float64 test above holds to 1e-12, so the padding itself is exact.
    assert_agree(reference, mixed, update_tolerance=1e-4, loss_tolerance=1e-4, floor=1e-2)
    assert identical(mixed, train_mixed(trainer, tasks, params))  # train_group planned one mixed unit


def test_a_group_of_one_width_trains_bit_for_bit_as_per_width_batching():
    """A trivial padding (masks all ones) changes nothing: train_mixed of one width is train_batched."""
    trainer, params, _ = setting("synthetic", double=False)
    tasks = make_tasks(trainer, [0.5] * 7, "fedprox")
    assert identical(train_mixed(trainer, tasks, params), train_batched(trainer, tasks, params))


class NoisyPadding(Padding):
    """Pads what is added to the gradient (SCAFFOLD's c − c_i) with ones instead of zeros."""

    def __init__(self, *args):
        super().__init__(*args)
        self.outside = {name: 1 - mask for name, mask in self.masks.items()}

    def pad(self, c, name, tensor):
        return super().pad(c, name, tensor) + self.outside[name][c]


class UnmaskedNoisyPadding(NoisyPadding):
    def __init__(self, *args):
        super().__init__(*args)
        self.masks = None


def test_the_mask_keeps_whatever_is_added_to_the_gradient_off_the_padded_coordinates(monkeypatch):
    import hasfl_ray.training.mixed as mixed_module

    trainer, params, widths = setting("synthetic", double=False)
    tasks = make_tasks(trainer, widths, "scaffold")
    clean = train_mixed(trainer, tasks, params)
    monkeypatch.setattr(mixed_module, "Padding", NoisyPadding)
    assert identical(clean, train_mixed(trainer, tasks, params))  # masked: bit for bit the same
    monkeypatch.setattr(mixed_module, "Padding", UnmaskedNoisyPadding)
    assert not identical(clean, train_mixed(trainer, tasks, params))  # the test has teeth: unmasked, it leaks


def test_the_padding_puts_each_client_at_the_leading_indices_inside_each_gate_block():
    specs = build_model("shakespeare").param_specs()
    padding = Padding(specs, [0.25, 0.5], 0.5, torch.device("cpu"), torch.float32)
    name = "lstm.weight_hh_l1"  # [4H, H], dim 0 in 4 gate blocks
    assert padding.shapes[name] == (4 * 128, 128) and padding.client_shapes[0][name] == (4 * 64, 64)
    mask = padding.masks[name][0].view(4, 128, 128)
    assert bool(mask[:, :64, :64].eq(1).all()) and float(mask.sum()) == 4 * 64 * 64
    packed = torch.arange(4 * 64 * 64, dtype=torch.float32).reshape(4 * 64, 64)
    padded = padding.pad(0, name, packed)
    assert torch.equal(padded.view(4, 128, 128)[:, :64, :64], packed.view(4, 64, 64))
    assert torch.equal(padding.own(0, {name: padded.unsqueeze(0)})[name], packed)
    assert float(padded.abs().sum()) == float(packed.abs().sum())  # zeros elsewhere
    with pytest.raises(ValueError, match=r"client 0's lstm.weight_hh_l1 has shape \(512, 128\); expected its packed"):
        padding.pad(0, name, torch.zeros(512, 128))


def test_mixed_grouping_puts_every_width_together_but_keeps_width_dependent_models_apart():
    fjord = OrderedDropoutObjective([0.25, 0.5], 1.0, seed=5)
    tasks = [ClientTask(0, 1, 0.5, 0.05, 7), ClientTask(1, 1, 0.25, 0.05, 7), ClientTask(2, 1, 0.5, 0.05, 7, fjord),
             ClientTask(3, 1, 1.0, 0.05, 7), ClientTask(4, 1, 0.25, 0.05, 7)]
    assert group_tasks(tasks, batching="mixed") == [[0, 1, 3, 4], [2]]
    assert group_tasks(tasks, batching="mixed", pads_exactly=False) == [[0], [1, 4], [2], [3]]  # as "on"
    assert group_tasks(tasks, batching="on") == group_tasks(tasks, batching=True) == [[0], [1, 4], [2], [3]]
    assert group_tasks(tasks, batching="off") == group_tasks(tasks, batching=False) == [[k] for k in range(5)]
    assert group_tasks(tasks, batching="mixed", max_group=3) == [[0, 1, 3], [2], [4]]
    many = [ClientTask(c, 1, [0.25, 0.5, 1.0][c % 3], 0.05, 7) for c in range(MAX_GROUP + 2)]
    assert group_tasks(many, batching="mixed") == [list(range(MAX_GROUP)), [MAX_GROUP, MAX_GROUP + 1]]
    with pytest.raises(ValueError, match="batching is 'auto'; expected one of off, on, mixed"):
        group_tasks(tasks, batching="auto")


def tiny_resnet(norm, scaler):
    name = f"tiny-preresnet[{norm},{scaler}]"
    register_model(name, dict(kind="preresnet18", in_channels=1, num_classes=10, image_size=8, norm=norm,
                              scaler=scaler, stages=[4, 8, 8, 8]))
    return name


def test_which_models_pad_exactly():
    assert all(pads_exactly(build_model(name)) for name in ("emnist", "digits", "shakespeare", "synthetic"))
    config = dict(kind="preresnet18", in_channels=1, num_classes=10, image_size=8, stages=[4, 8, 8, 8])
    assert not pads_exactly(build_model_from({**config, "norm": "bn", "scaler": True}))  # HeteroFL's Scaler: x / p
    assert not pads_exactly(build_model_from({**config, "norm": "gn", "scaler": False}))  # groups span padding
    assert pads_exactly(build_model_from({**config, "norm": "bn", "scaler": False}))
    assert pads_exactly(build_model_from({**config, "kind": "resnet18", "norm": "none", "scaler": False}))
    assert not pads_exactly(torch.nn.Linear(2, 2))  # a plug-in that does not say so


def test_the_resnet_without_the_scaler_trains_mixed_and_with_it_is_refused():
    sizes = [12, 9, 5]
    dataset = image_dataset("digits", sizes, (1, 8, 8), 10, double=False)
    settings = OptimizerSettings(momentum=0.9, weight_decay=1e-4, clip_norm=1.0, local_epochs=1, batch_size=4)
    name = tiny_resnet("bn", False)
    trainer = Trainer(dataset, name, settings)
    assert trainer.workspace.pads_exactly
    params = {k: v.detach().clone() for k, v in build_model(name).named_parameters()}
    tasks = [ClientTask(c, 1, w, 0.05, 7) for c, w in enumerate([1.0, 0.5, 0.25])]
    assert_agree([trainer.train(t, params) for t in tasks], train_mixed(trainer, tasks, params), 1e-4, 1e-5, 1e-2)
    scaled = Trainer(dataset, tiny_resnet("bn", True), settings)
    assert not scaled.workspace.pads_exactly
    with pytest.raises(ValueError, match="forward depends on its width"):
        train_mixed(scaled, tasks, params)
    results = scaled.train_group(tasks, params, batching="mixed")  # planned by width: every client alone here
    assert [r.width for r in results] == [1.0, 0.5, 0.25]


# -- runs ----------------------------------------------------------------------------------------------------

#: 3 rounds, ragged Dirichlet clients, HAS-FL adapting from round 1 (test_batched.py's RUN, whose seed keeps every
#: client of the digits off a ReLU or pooling kink; mixed is then ~2e-7 from off on the digits CNN, and equal or
#: ~1e-8 on the synthetic MLP). On the CPU, as test_batched.py's runs: the seed's choice holds for a CPU's kernels.
RUN = dict(dataset="synthetic", rounds=3, clients=12, clients_per_round=6, seed=43, warmup=1, t_adapt=1,
           backend="local", device="cpu")


@pytest.mark.parametrize("dataset", ["synthetic", "digits"])
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_every_algorithm_mixed_agrees_with_one_at_a_time(algorithm, dataset):
    if dataset == "synthetic" and getattr(algorithm_class(algorithm), "implied_sub_model", None):
        # depthfl, scalefl: depth sub-models, which the synthetic MLP (no stages) lacks: refused in one sentence
        with pytest.raises(ConfigError, match="has no exits"):
            Engine(RunConfig(**{**RUN, "dataset": dataset}, algorithm=algorithm)).prepare()
        return
    one = Engine(RunConfig(**{**RUN, "dataset": dataset}, algorithm=algorithm, client_batching="off"))
    one.run()
    mixed = Engine(RunConfig(**{**RUN, "dataset": dataset}, algorithm=algorithm, client_batching="mixed"))
    mixed.run()
    reference, params = one.backend.get_params(), mixed.backend.get_params()
    for name, tensor in reference.items():  # test_batched.py's RUNS_RELATIVE: the kinks depend on the CPU
        assert gap(params[name], tensor, 1e-12) <= 5e-2, name
    for a, b in zip(one.history, mixed.history):
        assert abs(a["test_accuracy"] - b["test_accuracy"]) <= 0.005
        assert a["avg_p"] == pytest.approx(b["avg_p"], abs=1e-6)  # same allocations


def test_a_mixed_run_records_the_mode_and_trains_widths_together(tmp_path, monkeypatch):
    units = []
    plan = group_tasks

    def recording(tasks, batching, **kwargs):
        planned = plan(tasks, batching, **kwargs)
        units.append([sorted({tasks[k].width for k in unit}) for unit in planned])
        return planned

    import hasfl_ray.engine.backend as local_backend

    monkeypatch.setattr(local_backend, "group_tasks", recording)
    engine = Engine(RunConfig(**{**RUN, "algorithm": "heterofl", "client_batching": "mixed"}),
                    out_dir=str(tmp_path / "run"))
    engine.run()
    assert "client_batching: mixed" in (tmp_path / "run" / "config.yaml").read_text()
    assert any(len(widths) > 1 for round_units in units for widths in round_units)
