"""HeteroFL's statistics pass over its whole, augmented training set (``sbn_statistics_data: training_set``, issue
43 item 2): HeteroFL's ``stats`` (src/train_classifier_fed.py at cc40f3e) runs ``stats(dataset['train'], model)``, the
whole training set, samples no client holds included, through ``make_data_loader({'train': dataset})``: shuffled,
batch 10, each image through the training transform of src/data.py::fetch_dataset (``RandomCrop(32, padding=4)``,
``RandomHorizontalFlip()``, ``ToTensor()``, ``Normalize(mean, std)``), into a ``track=True`` model (BatchNorm2d with
momentum None) in train mode. Checked against that expression written out here, with torchvision's own functional
ops on the drawn corners and flips (the sampler's and the transform's draws come from the run seed's streams)."""

import numpy as np
import pytest
import torch
from torch import nn
from torchvision.transforms import functional as TF

from hasfl_ray.config import RunConfig
from hasfl_ray.data.base import TensorFederatedDataset
from hasfl_ray.engine.server import Server
from hasfl_ray.engine.statistics import SBN_AUGMENT_STREAM, StatisticsPlan, pass_batches
from hasfl_ray.errors import ConfigError
from hasfl_ray.models import register_model
from hasfl_ray.models.resnet import SBN_STREAM, PreResNet18, StaticBatchNorm2d
from hasfl_ray.training.seeding import torch_generator

STAGES = dict(in_channels=3, num_classes=4, image_size=32, stages=(4, 8, 8, 8))
MEAN, STD = (0.4914, 0.4822, 0.4465), (0.2023, 0.1994, 0.2010)  # HeteroFL src/data.py's CIFAR10 Normalize


def dataset():
    """46 uint8 CIFAR-like images of 4 classes; the clients hold 30 of them, 16 are held by no client."""
    generator = torch.Generator().manual_seed(0)
    labels = torch.randint(0, 4, (46,), generator=generator)
    x = (torch.rand(46, 3, 32, 32, generator=generator) * 120 + labels.view(-1, 1, 1, 1) * 40).to(torch.uint8)
    clients = [torch.arange(0, 10), torch.arange(10, 22), torch.arange(22, 30)]
    data = TensorFederatedDataset("toy", "toy", 4, x, labels, x[:12], labels[:12], clients, mean=MEAN, std=STD)
    data.view_keeps_train = True
    return data


def heterofl_stats_batches(data, seed, batch_size=10):
    """HeteroFL's loader, written out: the whole training set in a shuffled order (here the run seed's permutation of
    every training index), batches of ``batch_size``; each uint8 image padded by 4 black pixels, cropped at its drawn
    corner, flipped where drawn (RandomCrop, RandomHorizontalFlip), then ToTensor and Normalize."""
    order = np.random.default_rng([seed, SBN_STREAM]).permutation(len(data.train_y))
    for number, start in enumerate(range(0, len(order), batch_size)):
        chunk = torch.as_tensor(order[start:start + batch_size])
        generator = torch_generator(seed, SBN_AUGMENT_STREAM, number)
        corners = torch.randint(0, 9, (len(chunk), 2), generator=generator)  # crop_flip's documented draw order
        flips = torch.rand(len(chunk), generator=generator) < 0.5
        images = []
        for b, index in enumerate(chunk.tolist()):
            image = TF.crop(TF.pad(data.train_x[index], [4], fill=0), int(corners[b, 0]), int(corners[b, 1]), 32, 32)
            image = TF.hflip(image) if flips[b] else image
            images.append(TF.normalize(image.float() / 255, MEAN, STD))
        yield torch.stack(images), data.train_y[chunk]


def tracked_copy(model):
    """The same network with HeteroFL's ``track=True`` norms: nn.BatchNorm2d(momentum=None)."""
    reference = PreResNet18(norm="sbn", **STAGES)
    reference.load_state_dict(model.state_dict())
    for module in list(reference.modules()):
        for name, child in list(module.named_children()):
            if isinstance(child, StaticBatchNorm2d):
                tracked = nn.BatchNorm2d(child.num_features, momentum=None, track_running_stats=True)
                tracked.load_state_dict(child.state_dict(), strict=False)
                setattr(module, name, tracked)
    return reference


def test_the_training_set_pass_is_heterofls_stats_over_augmented_images_of_every_training_sample():
    data, seed = dataset(), 11
    plan = StatisticsPlan("shuffled", 10, seed, "training_set", "crop_flip")
    ours, theirs = list(pass_batches(data, plan)), list(heterofl_stats_batches(data, seed))
    assert [y.tolist() for _, y in ours] == [y.tolist() for _, y in theirs]
    assert sorted(torch.cat([y for _, y in ours]).tolist()) == sorted(data.train_y.tolist())  # all 46, unheld too
    for (x, _), (x0, _) in zip(ours, theirs):
        torch.testing.assert_close(x, x0, rtol=1e-5, atol=1e-5)
    # the statistics the server takes from it equal HeteroFL's tracked BatchNorm over those batches
    torch.manual_seed(0)
    name = "preresnet18-test-training-set-pass"
    register_model(name, dict(kind="preresnet18", norm="sbn", **STAGES))
    model = PreResNet18(norm="sbn", **STAGES)
    server = Server(name, dict(model.state_dict()), data, eval_batch_size=6, statistics=plan)
    calibrated = server.width_model(1.0)
    reference = tracked_copy(model)
    reference.train()
    with torch.no_grad():
        for x, _ in heterofl_stats_batches(data, seed):
            reference(x)
    theirs = [m for m in reference.modules() if isinstance(m, nn.BatchNorm2d)]
    ours = [m for m in calibrated.modules() if isinstance(m, StaticBatchNorm2d)]
    assert len(ours) == len(theirs) > 0
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a.running_mean, b.running_mean, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(a.running_var, b.running_var, rtol=1e-4, atol=1e-5)


def test_the_clients_pass_and_the_plain_training_set_read_other_data():
    data, seed = dataset(), 11
    augmented = torch.cat([x for x, _ in pass_batches(data, StatisticsPlan("shuffled", 10, seed, "training_set",
                                                                           "crop_flip"))])
    plain = list(pass_batches(data, StatisticsPlan("shuffled", 10, seed, "training_set", "none")))
    clients = list(pass_batches(data, StatisticsPlan("shuffled", 10, seed)))
    assert sum(len(y) for _, y in plain) == 46 and sum(len(y) for _, y in clients) == 30
    order = np.random.default_rng([seed, SBN_STREAM]).permutation(46)
    torch.testing.assert_close(torch.cat([x for x, _ in plain]), data._inputs(data.train_x[torch.as_tensor(order)]))
    assert not torch.allclose(augmented, torch.cat([x for x, _ in plain]))


@pytest.mark.parametrize("values,phrase", [
    ({"sbn_statistics_data": "everything"}, "sbn_statistics_data is 'everything'; expected clients"),
    ({"sbn_statistics_data": "training_set", "sbn_statistics": "in_order"},
     "sbn_statistics_data is 'training_set' but sbn_statistics is 'in_order'; expected training_set only with the "
     "shuffled pass"),
])
def test_bad_values_are_one_sentence(values, phrase):
    with pytest.raises(ConfigError, match=phrase):
        RunConfig(backend="local", **values)


def test_a_run_reads_the_training_set_and_trains_as_before(tmp_path):
    import json

    import hasfl_ray

    common = dict(dataset="digits", model="preresnet18", partition="classes:2", clients=10, clients_per_round=3,
                  rounds=1, seed=4, backend="local", augmentation="crop_flip", eval_widths=[0.5, 1.0])
    losses = {}
    for data in ("clients", "training_set"):
        summary = hasfl_ray.simulate({**common, "sbn_statistics_data": data}, out_dir=str(tmp_path / data))
        line = json.loads((tmp_path / data / "metrics.jsonl").read_text().splitlines()[-1])
        losses[data] = (summary["params_sha256"], line["loss_at_width"])
    assert losses["clients"][0] == losses["training_set"][0]  # the pass changes evaluation only
    assert all(losses["clients"][1][w] != losses["training_set"][1][w] for w in ("0.5", "1"))


def test_the_flag_reaches_the_config_and_a_bad_pairing_is_one_sentence_at_the_cli(tmp_path):
    from click.testing import CliRunner

    from hasfl_ray.cli.main import main

    result = CliRunner().invoke(main, ["simulate", "--backend", "local", "--dataset", "digits", "--model", "preresnet18",
                                       "--sbn-statistics", "in-order", "--sbn-statistics-data", "training-set",
                                       "--out", str(tmp_path / "run"), "--quiet"])
    assert result.exit_code == 2 and "sbn_statistics_data is 'training_set' but sbn_statistics is 'in_order'" in \
        result.output and "Traceback" not in result.output, result.output
    assert not (tmp_path / "run").exists()
