"""Training augmentation as the sub-model sources train CIFAR-10 (issue 35 item 8): torchvision's RandomCrop(32,
padding 4) then RandomHorizontalFlip (HeteroFL src/data.py::fetch_dataset, FedRolex data.py, Flower's FjORD
dataset.py::get_transforms), checked against torchvision's own functional ops on the drawn corners and flips; seeded
by (seed, round, client, step), so every training path and backend gives the same bits."""

import pytest
import torch
from click.testing import CliRunner
from torchvision.transforms import functional as TF

from hasfl_ray.cli.main import main
from hasfl_ray.config import RunConfig
from hasfl_ray.data.base import TensorFederatedDataset
from hasfl_ray.errors import ConfigError
from hasfl_ray.models import build_model
from hasfl_ray.training.augment import STREAM_AUGMENT, augment_batch, crop_flip
from hasfl_ray.training.batched import train_batched
from hasfl_ray.training.local import ClientTask, OptimizerSettings, Trainer
from hasfl_ray.training.seeding import torch_generator


def test_crop_flip_is_torchvisions_pad_crop_and_hflip_on_the_drawn_corners():
    x = torch.randn(6, 3, 32, 32)
    fill = torch.tensor([-1.5, -2.0, -1.75])
    generator = torch_generator(1, STREAM_AUGMENT, 2, 3, 4)
    got = crop_flip(x, torch_generator(1, STREAM_AUGMENT, 2, 3, 4), fill)
    corners = torch.randint(0, 9, (6, 2), generator=generator)  # the draws, in crop_flip's documented order
    flips = torch.rand(6, generator=generator) < 0.5
    for b in range(6):
        padded = torch.stack([TF.pad(x[b, c:c + 1], [4], fill=float(fill[c]))[0] for c in range(3)])
        image = TF.crop(padded, int(corners[b, 0]), int(corners[b, 1]), 32, 32)
        if flips[b]:
            image = TF.hflip(image)
        assert torch.equal(got[b], image), b
    assert flips.any() and not flips.all() and len({tuple(c.tolist()) for c in corners}) > 1


def test_the_draws_are_keyed_by_seed_round_client_and_step():
    x = torch.randn(8, 3, 16, 16)
    fill = torch.zeros(3)
    same = augment_batch(x, 7, 1, 2, 3, fill)
    assert torch.equal(same, augment_batch(x, 7, 1, 2, 3, fill))
    for other in ((8, 1, 2, 3), (7, 0, 2, 3), (7, 1, 1, 3), (7, 1, 2, 4)):
        assert not torch.equal(same, augment_batch(x, *other, fill))


def trainer(augmentation):
    torch.manual_seed(0)
    sizes = [40, 24, 9]
    n = sum(sizes)
    x = torch.randint(0, 256, (n, 3, 32, 32), dtype=torch.uint8)
    y = torch.randint(0, 10, (n,))
    data = TensorFederatedDataset("cifar10", "cifar10", 10, x, y, x[:8], y[:8], list(torch.arange(n).split(sizes)),
                                  mean=[0.49, 0.48, 0.45], std=[0.25, 0.24, 0.26])
    settings = OptimizerSettings(momentum=0.9, weight_decay=1e-4, clip_norm=1.0, local_epochs=1, batch_size=8,
                                 augmentation=augmentation)
    params = {k: v.detach().clone() for k, v in build_model("cifar10").named_parameters()}
    return Trainer(data, "cifar10", settings), params


def test_training_sees_the_augmented_batches_one_at_a_time_and_batched_alike():
    model, params = trainer("crop_flip")
    plain, _ = trainer("none")
    tasks = [ClientTask(c, 3, 0.5, 0.05, 7) for c in range(3)]
    alone = [model.train(task, params) for task in tasks]
    without = [plain.train(task, params) for task in tasks]
    assert any(not torch.equal(a.update[n], b.update[n]) for a, b in zip(alone, without) for n in a.update)
    again = [model.train(task, params) for task in tasks]
    assert all(torch.equal(a.update[n], b.update[n]) for a, b in zip(alone, again) for n in a.update)
    together = train_batched(model, tasks, params)
    for a, b in zip(alone, together):
        for name in a.update:
            # atol 1e-4: on a Zen 3 (AVX2, no AVX-512) the batched convolutions' other summation order left up to
            # 2.1e-5 (1e-6 held on the Zen 5); an augmentation applied to the wrong batch moves updates by 1e-2 and more
            torch.testing.assert_close(b.update[name], a.update[name], rtol=1e-4, atol=1e-4)
    # the fill: a black pixel of the standardised batch, (0 - mean) / std per channel
    torch.testing.assert_close(model.workspace._fill,
                               -torch.tensor([0.49, 0.48, 0.45]) / torch.tensor([0.25, 0.24, 0.26]))


def test_a_run_with_augmentation_differs_and_bad_values_are_one_sentence(tmp_path):
    import json
    base = ["simulate", "--backend", "local", "--rounds", "1", "--clients", "4", "--clients-per-round", "2", "--quiet"]
    plain = CliRunner().invoke(main, base + ["--out", str(tmp_path / "a")])
    augmented = CliRunner().invoke(main, base + ["--augmentation", "crop-flip", "--out", str(tmp_path / "b")])
    assert plain.exit_code == 0 and augmented.exit_code == 0, augmented.output
    hashes = [json.loads((tmp_path / r / "summary.json").read_text())["params_sha256"] for r in "ab"]
    assert hashes[0] != hashes[1]
    with pytest.raises(ConfigError, match="augmentation is 'flip'; expected none or crop_flip"):
        RunConfig(backend="local", augmentation="flip")
    text = CliRunner().invoke(main, base + ["--dataset", "synthetic", "--augmentation", "crop-flip", "--out",
                                            str(tmp_path / "c")])
    assert text.exit_code == 2 and "has no image batches" in text.output and not (tmp_path / "c").exists()


def test_the_sources_packs_augment():
    import yaml
    for pack in ("heterofl-cifar10", "fedrolex-cifar10", "fjord-cifar10"):
        with open(f"configs/pack-{pack}.yaml", encoding="utf-8") as handle:
            assert yaml.safe_load(handle)["augmentation"] == "crop_flip", pack
