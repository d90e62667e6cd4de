"""Local accuracy as HeteroFL and FedRolex score it (``local_eval_rule: source``): each client on its own test
shard of a classes:K partition, the global model at width 1, logits outside the client's label split set to 0, the
mean weighted by samples. Checked against the sources' expression written out here (HeteroFL
``src/models/resnet.py::ResNet.forward``: ``out.masked_fill(label_mask == 0, 0)``; ``src/train_classifier_fed.py::
test``: every client's shard, ``Accuracy`` averaged by ``input_size``), not against the project's own function."""

import json

import numpy as np
import pytest
import torch

from hasfl_ray.engine import Engine, RunConfig
from hasfl_ray.engine.evaluating import NO_SHARDS_LOCAL_ACCURACY
from hasfl_ray.errors import ConfigError
from hasfl_ray.evaluation import shard_local_accuracies, weighted_mean
from hasfl_ray.models import build_model


def source_accuracy(logits, labels, label_split):
    """HeteroFL's rule for one client: label_mask over C, masked_fill(label_mask == 0, 0), top-1 over all C."""
    label_mask = torch.zeros(logits.shape[1])
    label_mask[torch.as_tensor(label_split)] = 1
    out = logits.masked_fill(label_mask == 0, 0)
    return int((out.argmax(dim=1) == labels).sum()), len(labels)


def test_shard_accuracies_are_the_sources_zero_filled_top_1():
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(300, 10, generator=generator) - 1.0  # mostly negative: the 0 fill often wins
    labels = torch.randint(0, 10, (300,), generator=generator)
    split = [[1, 4], [2], [0, 3, 9], [5, 6]]
    shards = [np.arange(0, 80), np.arange(80, 130), np.arange(130, 260), np.arange(260, 300)]
    masked, unmasked, samples = shard_local_accuracies(labels.numpy(), logits.numpy(), shards, split)
    correct = total = 0
    for c, (shard, held) in enumerate(zip(shards, split)):
        right, n = source_accuracy(logits[shard], labels[shard], held)
        assert masked[c] == pytest.approx(right / n) and samples[c] == n
        assert unmasked[c] == pytest.approx(float((logits[shard].argmax(1) == labels[shard]).double().mean()))
        correct, total = correct + right, total + n
    assert weighted_mean(masked, samples) == pytest.approx(correct / total)
    # not the -inf restriction: with negative held logits a zero-filled label is predicted
    neg_inf = [float((logits[s].masked_fill(torch.isin(torch.arange(10), torch.as_tensor(h)).logical_not(),
                                             -torch.inf).argmax(1) == labels[s]).double().mean())
               for s, h in zip(shards, split)]
    assert not np.allclose(masked, neg_inf)


RUN = dict(dataset="digits", partition="classes:2", clients=10, clients_per_round=5, rounds=2, seed=3,
           local_eval_rule="source", backend="local", device="cpu")


def test_a_run_scores_each_client_on_its_own_shard_with_the_global_model(tmp_path):
    engine = Engine(RunConfig(**RUN), out_dir=str(tmp_path / "run"))
    summary = engine.run()
    local = summary["local_accuracy"]
    assert local["rule"] == "source" and local["weighted"] and local["width"] == "global"
    model = build_model("digits")  # the global model at width 1, from the run's final parameters
    model.load_state_dict(engine.backend.get_params(), strict=False)
    model.eval()
    dataset = engine.dataset
    correct = total = 0
    rows = list(csv_rows(tmp_path / "run" / "clients.csv"))
    with torch.no_grad():
        for c, (shard, held) in enumerate(zip(dataset.client_test_indices, dataset.label_split)):
            x, y = next(iter(dataset.test_subset_batches(shard, len(shard))))
            right, n = source_accuracy(model(x), y, held)
            assert float(rows[c]["local_accuracy"]) == pytest.approx(right / n)
            assert int(rows[c]["local_test_samples"]) == n and float(rows[c]["local_width"]) == 1.0
            correct, total = correct + right, total + n
    assert local["mean"] == pytest.approx(correct / total)
    assert total == sum(len(s) for s in dataset.client_test_indices)


def csv_rows(path):
    import csv

    with open(path, newline="", encoding="utf-8") as handle:
        yield from csv.DictReader(handle)


def test_without_test_shards_the_sources_rule_says_it_is_not_defined(tmp_path):
    summary = Engine(RunConfig(**{**RUN, "partition": "iid"}), out_dir=str(tmp_path / "iid")).run()
    assert summary["local_accuracy"] == NO_SHARDS_LOCAL_ACCURACY
    labels = Engine(RunConfig(**{**RUN, "local_eval_rule": "labels"}), out_dir=str(tmp_path / "labels")).run()
    assert "rule" not in labels["local_accuracy"]  # today's rule, unchanged


def test_a_bad_rule_is_one_sentence():
    with pytest.raises(ConfigError, match="local_eval_rule is 'heterofl'; expected labels"):
        RunConfig(backend="local", local_eval_rule="heterofl")


def test_the_heterofl_and_fedrolex_packs_use_the_sources_rule():
    import yaml

    for pack in ("configs/pack-heterofl-cifar10.yaml", "configs/pack-fedrolex-cifar10.yaml"):
        with open(pack, encoding="utf-8") as handle:
            assert yaml.safe_load(handle)["local_eval_rule"] == "source", pack
