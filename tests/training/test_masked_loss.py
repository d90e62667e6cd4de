"""Masked cross-entropy in local training (``masked_loss``, issue 35 item 3): HeteroFL's and FedRolex's ``mask 1``.

The rule, from HeteroFL's src/models/resnet.py (``ResNet.forward``; src/train_classifier_fed.py's ``Local.train``
puts the client's ``label_split`` in every training batch's input):

    if 'label_split' in input and cfg['mask']:
        label_mask = torch.zeros(cfg['classes_size'], device=out.device)
        label_mask[input['label_split']] = 1
        out = out.masked_fill(label_mask == 0, 0)
    output['score'] = out
    output['loss'] = F.cross_entropy(output['score'], input['label'])

Checked here against an independent transcription of those lines in a hand-written SGD loop (float64), for every
training path (one at a time, the static CUDA-graph step, batched, mixed widths, FjORD's objective), and that the
option is off by default and a bad value is one sentence.
"""

import os

import pytest
import torch
from click.testing import CliRunner
from torch.nn import functional as F

from hasfl_ray.algorithms.fjord import OrderedDropoutObjective
from hasfl_ray.algorithms.fjord import nested_parameters
from hasfl_ray.cli.main import main
from hasfl_ray.data import load_dataset
from hasfl_ray.data.base import TensorFederatedDataset
from hasfl_ray.engine import Engine, RunConfig
from hasfl_ray.errors import ConfigError
from hasfl_ray.models import build_model
from hasfl_ray.training.batched import train_batched
from hasfl_ray.training.local import ClientTask, LocalObjective, OptimizerSettings, Trainer
from hasfl_ray.training.mixed import train_mixed
from hasfl_ray.training.seeding import STREAM_CLIENT, torch_generator
from test_mixed import CASES, assert_agree, float64, make_tasks, setting  # noqa: F401 (float64: a fixture)

#: Each client's labels (its label split) and samples; batches of 8 leave a short last batch, never one sample.
SPLITS = [[1, 7], [0, 3, 5], [2, 9], [4, 6, 8, 9]]
SIZES = [37, 28, 19, 44]
SETTINGS = OptimizerSettings(momentum=0.9, weight_decay=5e-4, clip_norm=1.0, local_epochs=2, batch_size=8)


def split_dataset(double=True):
    """The synthetic MLP's inputs (60 features, 10 classes); client c's labels drawn from SPLITS[c] only."""
    generator = torch.Generator().manual_seed(5)
    xs, ys = [], []
    for labels, n in zip(SPLITS, SIZES):
        xs.append(torch.randn(n, 60, generator=generator, dtype=torch.float64 if double else torch.float32))
        ys.append(torch.tensor(labels)[torch.randint(0, len(labels), (n,), generator=generator)])
    x, y = torch.cat(xs), torch.cat(ys)
    return TensorFederatedDataset("synthetic", "synthetic", 10, x, y, x[:8], y[:8],
                                  list(torch.arange(len(y)).split(SIZES)))


def heterofl_sgd(model, x_all, y_all, label_split, task, settings):
    """Client ``task``'s local training written out: its batches (a randperm of its samples per epoch from its own
    generator, cut into batch_size), HeteroFL's masked logits, F.cross_entropy, clip_grad_norm_ and torch.optim.SGD;
    the trained parameters."""
    optimizer = torch.optim.SGD(model.parameters(), lr=task.lr, momentum=settings.momentum,
                                weight_decay=settings.weight_decay)
    generator = torch_generator(task.seed, STREAM_CLIENT, task.round, task.client)
    model.train()
    for _ in range(settings.local_epochs):
        order = torch.randperm(len(y_all), generator=generator)
        for start in range(0, len(y_all), settings.batch_size):
            positions = order[start:start + settings.batch_size]
            x, y = x_all[positions], y_all[positions]
            optimizer.zero_grad()
            out = model(x)
            label_mask = torch.zeros(10, device=out.device)
            label_mask[torch.tensor(label_split)] = 1
            out = out.masked_fill(label_mask == 0, 0)
            loss = F.cross_entropy(out, y)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), settings.clip_norm)
            optimizer.step()
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def test_the_clients_mask_is_the_labels_it_holds_and_under_classes_k_its_label_split():
    dataset = split_dataset()
    trainer = Trainer(dataset, "synthetic", SETTINGS)
    for client, labels in enumerate(SPLITS):
        held = ~trainer.workspace.masked_labels(ClientTask(client, 0, 1.0, 0.1, 0, masked_loss=True))
        assert torch.nonzero(held).flatten().tolist() == labels
    assert trainer.workspace.masked_labels(ClientTask(0, 0, 1.0, 0.1, 0)) is None  # off: no mask
    digits = load_dataset("digits", 10, 0.3, 3, partition="classes:2")
    trainer = Trainer(digits, "digits", SETTINGS)
    for client, labels in enumerate(digits.label_split):
        held = ~trainer.workspace.masked_labels(ClientTask(client, 0, 1.0, 0.1, 0, masked_loss=True))
        assert torch.nonzero(held).flatten().tolist() == sorted(labels)


@pytest.mark.parametrize("graphs", [False, True])
def test_one_at_a_time_masked_training_is_heterofls_expression_in_a_hand_written_sgd_loop(float64, graphs):
    dataset = split_dataset()
    torch.manual_seed(0)
    params = {k: v.detach().clone() for k, v in build_model("synthetic").named_parameters()}
    trainer = Trainer(dataset, "synthetic", SETTINGS, cuda_graphs=graphs)  # graphs: the static step (CPU: eager)
    for client, labels in enumerate(SPLITS):
        task = ClientTask(client, 4, 1.0, 0.3, 11, masked_loss=True)
        got = trainer.train(task, params)
        model = build_model("synthetic")
        model.load_state_dict(params, strict=False)
        indices = dataset.client_indices[client]
        want = heterofl_sgd(model, dataset.train_x[indices], dataset.train_y[indices], labels, task, SETTINGS)
        assert got.steps == 2 * -(-SIZES[client] // 8)
        for name, update in got.update.items():
            torch.testing.assert_close(params[name] + update, want[name], rtol=1e-12, atol=1e-13)
        unmasked = trainer.train(ClientTask(client, 4, 1.0, 0.3, 11), params)
        assert max(float((unmasked.update[n] - got.update[n]).abs().max()) for n in got.update) > 1e-3  # it acts
    if graphs:
        assert trainer.steps.built == 2  # one static step for the masked clients (one batch shape), one unmasked


def test_the_static_step_with_a_mask_equals_one_at_a_time_bit_for_bit_client_after_client():
    dataset = split_dataset(double=False)
    torch.manual_seed(0)
    params = {k: v.detach().clone() for k, v in build_model("synthetic").named_parameters()}
    eager, static = Trainer(dataset, "synthetic", SETTINGS), Trainer(dataset, "synthetic", SETTINGS, cuda_graphs=True)
    for client in [0, 1, 2, 3, 1, 0]:  # the static mask is each client's, whoever trained before
        task = ClientTask(client, 4, 0.5, 0.3, 11, masked_loss=True)
        one, two = eager.train(task, params), static.train(task, params)
        assert one.loss == two.loss and all(torch.equal(one.update[n], two.update[n]) for n in one.update)
    assert static.steps.built == 1


def mask_like_heterofl(out, labels):
    label_mask = torch.zeros(out.shape[-1])
    label_mask[torch.tensor(labels)] = 1
    return out.masked_fill(label_mask == 0, 0)


@pytest.mark.parametrize("kd", [True, False])
def test_fjords_losses_read_the_masked_logits_of_every_width(float64, kd):
    dataset = split_dataset()
    torch.manual_seed(0)
    model = build_model("synthetic", 1.0)
    trainer = Trainer(dataset, "synthetic", SETTINGS)
    x, y = dataset.train_x[:8], torch.full((8,), 7)
    objective = OrderedDropoutObjective([0.5, 1.0], 0.7, seed=3, kd=kd)
    objective.masked_labels = trainer.workspace.masked_labels(ClientTask(0, 0, 1.0, 0.1, 0, masked_loss=True))
    objective.setup(model, {}, 1.0, torch.Generator(), model_at=trainer.workspace.model_at)
    for _ in range(4):
        loss = objective.loss(model, x, y)
        width = objective.sampled[-1]
        full = mask_like_heterofl(model(x), SPLITS[0])
        sub = mask_like_heterofl(torch.func.functional_call(trainer.workspace.model_at(width),
                                                            nested_parameters(model, width), (x,)), SPLITS[0])
        if not kd:
            want = F.cross_entropy(full if width == 1.0 else sub, y)
        else:
            want = F.cross_entropy(full, y)
            if width < 1.0:
                teacher = F.log_softmax(full.detach(), dim=1)
                want = want + 0.7 * F.kl_div(F.log_softmax(sub, dim=1), teacher, log_target=True,
                                             reduction="batchmean")
        torch.testing.assert_close(loss, want, rtol=1e-13, atol=1e-14)
    assert set(objective.sampled) == {0.5, 1.0}


def test_fjord_trains_with_the_mask_and_it_acts():
    dataset = split_dataset(double=False)
    torch.manual_seed(0)
    params = {k: v.detach().clone() for k, v in build_model("synthetic").named_parameters()}
    trainer = Trainer(dataset, "synthetic", SETTINGS)
    results = [trainer.train(ClientTask(1, 2, 1.0, 0.3, 11, OrderedDropoutObjective([0.5, 1.0], 1.0, seed=3),
                                        masked_loss=masked), params) for masked in (False, True)]
    assert results[0].extras["sampled_widths"] == results[1].extras["sampled_widths"]
    assert any(not torch.equal(results[0].update[n], results[1].update[n]) for n in results[0].update)


@pytest.mark.parametrize("objective", ["plain", "fedrolex", "fedprox", "scaffold"])
@pytest.mark.parametrize("model", list(CASES))
def test_batched_and_mixed_masked_training_equal_one_at_a_time_in_float64(float64, model, objective):
    trainer, params, widths = setting(model, double=True)
    tasks = make_tasks(trainer, widths, objective)
    for task in tasks:
        task.masked_loss = True
    absent = [int(trainer.workspace.masked_labels(task).sum()) for task in tasks]
    assert max(absent) > 0 and len(set(absent)) > 1  # clients hold different labels: masks that differ
    reference = [trainer.train(task, params) for task in tasks]
    assert_agree(reference, train_mixed(trainer, tasks, params), update_tolerance=1e-10, loss_tolerance=1e-12,
                 floor=1e-6)
    one_width = [k for k, w in enumerate(widths) if w == widths[0]]
    assert_agree([reference[k] for k in one_width], train_batched(trainer, [tasks[k] for k in one_width], params),
                 update_tolerance=1e-10, loss_tolerance=1e-12, floor=1e-6)
    for task in tasks:
        task.masked_loss = False
    unmasked = train_mixed(trainer, tasks, params)
    assert any(abs(a.loss - b.loss) > 1e-6 for a, b in zip(reference, unmasked) if a.steps)  # the mask acts


RUN = dict(dataset="digits", partition="classes:2", clients=10, clients_per_round=5, rounds=2, seed=3,
           backend="local", device="cpu", checkpoint_every=0)


def test_a_classes_2_digits_run_with_the_option_differs_and_every_path_agrees():
    off = Engine(RunConfig(**RUN, algorithm="heterofl")).run()["params_sha256"]
    on = Engine(RunConfig(**RUN, algorithm="heterofl", masked_loss=True))
    assert on.run()["params_sha256"] != off
    graphed = Engine(RunConfig(**RUN, algorithm="heterofl", masked_loss=True, cuda_graphs="on"))
    graphed.run()
    reference = on.backend.get_params()
    graphed_params = graphed.backend.get_params()
    assert all(torch.equal(graphed_params[n], t) for n, t in reference.items())  # CPU static step: bit for bit
    # Batched and mixed: one round. After two, the float32 rounding of round 0's aggregate (~3e-7) is amplified by one
    # client's round-1 training to 4e-3 (one-at-a-time training from either aggregate differs as much; from the same
    # aggregate the modes agree to 5e-5); the trainer-level tests above hold the float64 agreement.
    one_round = {**RUN, "rounds": 1, "algorithm": "heterofl", "masked_loss": True}
    eager = Engine(RunConfig(**one_round))
    eager.run()
    reference = eager.backend.get_params()
    for mode in ("on", "mixed"):
        batched = Engine(RunConfig(**one_round, client_batching=mode))
        batched.run()
        for name, tensor in batched.backend.get_params().items():
            assert float((tensor - reference[name]).norm()) <= 1e-5 * max(float(reference[name].norm()), 1e-3), name


def test_the_option_is_off_by_default_recorded_and_an_old_run_resumes_as_off(tmp_path):
    from hasfl_ray.engine.checkpoint import config_differences

    assert RunConfig().masked_loss is False
    assert RunConfig(masked_loss="on").masked_loss is True and RunConfig(masked_loss="off").masked_loss is False
    stored = RunConfig(**RUN).resolved().to_dict()
    del stored["masked_loss"]
    assert config_differences(stored, RunConfig(**RUN).resolved()) == []
    assert config_differences(stored, RunConfig(**RUN, masked_loss=True).resolved()) == ["masked_loss False -> True"]


@pytest.mark.parametrize("value", ["maybe", 1, None, "ON"])
def test_a_bad_value_is_one_sentence(value):
    with pytest.raises(ConfigError, match=r"^masked_loss is .*; expected true or false \(on or off\)$"):
        RunConfig(masked_loss=value)


def test_a_bad_value_on_the_command_line_or_in_a_config_file_is_one_sentence_and_exit_2(tmp_path):
    out = tmp_path / "run"
    result = CliRunner().invoke(main, ["simulate", "--backend", "local", "--masked-loss", "sometimes", "--quiet",
                                       "--out", str(out)])
    assert result.exit_code == 2
    assert result.output.strip().splitlines()[-1] == "Error: masked_loss is 'sometimes'; expected true or false (on " \
                                                     "or off)"
    config = tmp_path / "run.yaml"
    config.write_text("masked_loss: yes please\n")
    result = CliRunner().invoke(main, ["simulate", "--config", str(config), "--backend", "local", "--quiet",
                                       "--out", str(out)])
    assert result.exit_code == 2
    assert "masked_loss is 'yes please'; expected true or false (on or off)" in result.output
    assert "Traceback" not in result.output and not os.path.exists(out)
