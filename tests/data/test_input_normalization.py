"""``input_normalization: sources``: CIFAR batches standardised as the sub-model sources' code standardises them.

The sources' rule (HeteroFL src/data.py::fetch_dataset at commit cc40f3e46b0f, FedRolex data.py::fetch_dataset at
commit 813510997e18, CIFAR10 train and test): ``ToTensor()`` (pixels / 255) then ``Normalize`` with the fixed
per-channel mean (0.4914, 0.4822, 0.4465) and std (0.2023, 0.1994, 0.2010), whatever split was loaded; the training
transform crops and flips before. hasfl-ray's default (``split``) standardises with the loaded training split's own
mean and std instead (std about 0.247 on CIFAR-10), so the sources' inputs are 1.22-1.30 times ours."""

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from torchvision.transforms import Normalize

from dataset_files import make_cifar_root
from hasfl_ray.cli.main import main
from hasfl_ray.data import load_plugin_dataset
from hasfl_ray.engine import RunConfig
from hasfl_ray.errors import ConfigError
from hasfl_ray.registry import lookup

SOURCE_MEAN, SOURCE_STD = (0.4914, 0.4822, 0.4465), (0.2023, 0.1994, 0.2010)


def loaded(root, normalization):
    config = RunConfig(dataset="cifar10", data_dir=str(root), clients=4, clients_per_round=4, partition="iid",
                       input_normalization=normalization)
    return load_plugin_dataset(lookup("dataset", "cifar10"), config)


def test_sources_normalization_is_the_sources_transform(tmp_path):
    make_cifar_root(tmp_path)
    dataset = loaded(tmp_path, "sources")
    source = Normalize(SOURCE_MEAN, SOURCE_STD)
    x, _ = next(iter(dataset.test_batches(dataset.test_size)))
    torch.testing.assert_close(x, source(dataset.test_x.to(torch.float32) / 255), rtol=0, atol=1e-5)
    positions = torch.arange(dataset.client_size(0))
    x, _ = dataset.client_batch(0, positions)
    raw = dataset.train_x[dataset.client_indices[0][positions]]
    torch.testing.assert_close(x, source(raw.to(torch.float32) / 255), rtol=0, atol=1e-5)
    # the default still standardises with the split's own statistics: a mean-0, std-1 training split
    own = loaded(tmp_path, "split")
    pixels = torch.cat([own.client_batch(c, torch.arange(own.client_size(c)))[0] for c in range(4)])
    assert np.allclose(pixels.mean(dim=(0, 2, 3)).numpy(), 0, atol=1e-4)


def test_sources_normalization_is_refused_beside_another_dataset(tmp_path):
    with pytest.raises(ConfigError, match="input_normalization is 'sources'; expected split with dataset 'digits'"):
        RunConfig(dataset="digits", input_normalization="sources")
    with pytest.raises(ConfigError, match="input_normalization is 'imagenet'; expected split"):
        RunConfig(dataset="cifar10", input_normalization="imagenet")
    result = CliRunner().invoke(main, ["simulate", "--dataset", "digits", "--input-normalization", "sources",
                                       "--rounds", "1", "--out", str(tmp_path / "run")])
    assert result.exit_code == 2 and "expected split with dataset 'digits'" in result.output
    assert "Traceback" not in result.output and not (tmp_path / "run").exists()


def test_a_config_files_normalization_meets_the_flags_dataset(tmp_path):
    """A config file's ``input_normalization: sources`` beside ``--dataset cifar10`` is checked against that
    dataset, not the default one: the run goes on to read its data (here a missing folder, one sentence)."""
    config = tmp_path / "c.yaml"
    config.write_text("input_normalization: sources\nrounds: 1\n", encoding="utf-8")
    result = CliRunner().invoke(main, ["simulate", "--config", str(config), "--dataset", "cifar10", "--data-dir",
                                       str(tmp_path / "none"), "--out", str(tmp_path / "run")])
    assert result.exit_code == 2 and "CIFAR-10 batches not found" in result.output, result.output


def test_a_config_files_normalization_and_dataset_both_overridden_by_flags_run(tmp_path):
    """``--dataset digits --input-normalization split`` over a CIFAR-10 pack-like file (``dataset: cifar10``,
    ``input_normalization: sources``) is a valid digits run: the file's pair was checked against the flag's dataset
    but not the flag's normalisation, so it was refused (expected split with dataset 'digits', which it was)."""
    config = tmp_path / "c.yaml"
    config.write_text("dataset: cifar10\ninput_normalization: sources\nrounds: 1\n", encoding="utf-8")
    run = tmp_path / "run"
    result = CliRunner().invoke(main, ["simulate", "--config", str(config), "--dataset", "digits",
                                       "--input-normalization", "split", "--clients", "6", "--clients-per-round", "3",
                                       "--backend", "local", "--quiet", "--out", str(run)])
    assert result.exit_code == 0, result.output
    stored = (run / "config.yaml").read_text(encoding="utf-8")
    assert "dataset: digits\n" in stored and "input_normalization: split\n" in stored
    # the flag's dataset alone still meets the file's sources: one sentence, no folder
    alone = CliRunner().invoke(main, ["simulate", "--config", str(config), "--dataset", "digits", "--out",
                                      str(tmp_path / "alone")])
    assert alone.exit_code == 2 and "expected split with dataset 'digits'" in alone.output, alone.output
    assert not (tmp_path / "alone").exists()
