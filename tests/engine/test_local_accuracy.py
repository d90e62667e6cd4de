"""Local accuracy per client (issue 25 items 2, 3): the beats bitmasks against a plain float64 reference, every
client's clients.csv numbers against a direct per-client computation, the summary's statistics, the schedule,
synthetic (defined) and text (not defined), 10,000 clients at once."""

import csv
import json

import numpy as np
import pytest
import torch

from hasfl_ray.data import load_plugin_dataset
from hasfl_ray.engine import Engine, RunConfig
from hasfl_ray.engine.engine import TEXT_LOCAL_ACCURACY
from hasfl_ray.evaluation import (accuracy_summary, beats, local_accuracies, pack_bits, reference_local_accuracies,
                                  right, submodel_groups)
from hasfl_ray.models import build_model, extract
from hasfl_ray.registry import lookup

SMALL = dict(rounds=4, clients=6, clients_per_round=3, seed=5, backend="local", warmup=1, t_adapt=1)


def packed_beats(logits, labels):
    return np.stack([pack_bits(beats(torch.as_tensor(l), torch.as_tensor(labels)).numpy()) for l in logits])


@pytest.mark.parametrize("classes", [10, 62, 64, 95])
def test_the_bitmask_computation_equals_the_float64_reference(classes):  # issue 25 item 3
    rng = np.random.default_rng(classes)
    groups_n, samples, clients = 3, 400, 150
    logits = rng.integers(0, 4, (groups_n, samples, classes)).astype(np.float32)  # many ties: the first index wins
    labels = rng.integers(0, classes, samples)
    groups = rng.integers(0, groups_n, clients)
    counts = rng.integers(1, 4, (clients, classes)) * (rng.random((clients, classes)) < 0.2)
    counts[0] = 0  # no labels: no test sample, NaN
    counts[1, :] = 0
    counts[1, classes - 1] = 5  # one label only: always right when masked
    got = local_accuracies(labels, packed_beats(logits, labels), groups, counts)
    want = reference_local_accuracies(labels, logits, groups, counts)
    assert np.array_equal(got[2], want[2])
    for a, b in zip(got[:2], want[:2]):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-15, equal_nan=True)
    assert np.isnan(got[0][0]) and got[0][1] == 1.0


@pytest.mark.parametrize("classes", [10, 64])
def test_a_nan_logit_is_never_right(classes):  # issue 49 item 6 (battery 5's problem 4)
    """Was: a NaN beat nothing, so a NaN model scored 100 % local accuracy; now a NaN label logit is wrong under any
    mask (a one-label client included), a NaN elsewhere beats the label as argmax says, and the bitmask
    computation still equals the float64 reference."""
    rng = np.random.default_rng(classes)
    groups_n, samples, clients = 2, 300, 80
    logits = rng.integers(0, 4, (groups_n, samples, classes)).astype(np.float32)
    logits[rng.random(logits.shape) < 0.05] = np.nan
    logits[1, :20] = np.nan  # whole rows of NaN: argmax says class 0, which is never right here
    labels = rng.integers(0, classes, samples)
    labels[20:30] = 0
    logits[1, 25, 0] = np.nan  # a label-0 sample the one-label client below gets wrong
    groups = rng.integers(0, groups_n, clients)
    counts = rng.integers(1, 4, (clients, classes)) * (rng.random((clients, classes)) < 0.3)
    counts[:, 0] += 1
    counts[1, :] = 0
    counts[1, 0] = 5  # one label only: right unless its logit is NaN
    groups[1] = 1
    got = local_accuracies(labels, packed_beats(logits, labels), groups, counts)
    want = reference_local_accuracies(labels, logits, groups, counts)
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-15, equal_nan=True)
    zero = labels == 0
    assert got[0][1] == np.mean(~np.isnan(logits[1][zero, 0])) < 1.0
    all_nan = np.full((1, samples, classes), np.nan, dtype=np.float32)
    nothing = local_accuracies(labels, packed_beats(all_nan, labels), np.zeros(clients, dtype=np.int64), counts)
    assert np.all(nothing[0][counts.sum(1) > 0] == 0) and np.all(nothing[1][counts.sum(1) > 0] == 0)
    assert not right(torch.as_tensor(all_nan[0]), torch.as_tensor(labels)).any()


def test_clients_whose_widths_give_the_same_channels_share_a_pass():  # issue 25 item 3
    specs = build_model("digits").param_specs()
    chosen, groups = submodel_groups(np.array([0.5, 0.25, 0.5, 1.0, 0.26, 0.251]),
                                     lambda w: tuple(s.sliced_shape(w) for s in specs.values()))
    assert chosen[0] == 0.25 and chosen[-1] == 1.0 and len(chosen) <= 5
    assert groups[0] == groups[2] and groups[1] != groups[3]


def test_ten_thousand_clients_at_once():  # issue 25 item 3: counted per distinct (sub-model, label set), not per client
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 10, 2000)
    logits = rng.normal(size=(4, 2000, 10)).astype(np.float32)
    counts = rng.integers(0, 5, (10_000, 10)) * (rng.random((10_000, 10)) < 0.5)
    groups = rng.integers(0, 4, 10_000)
    masked, unmasked, samples = local_accuracies(labels, packed_beats(logits, labels), groups, counts)
    some = rng.choice(10_000, 50, replace=False)
    want = reference_local_accuracies(labels, logits, groups[some], counts[some])
    np.testing.assert_allclose(masked[some], want[0], atol=1e-15, equal_nan=True)
    np.testing.assert_allclose(unmasked[some], want[1], atol=1e-15, equal_nan=True)


def test_the_summary_statistics():  # issue 25 item 2
    acc = np.array([0.5, 1.0, np.nan, 0.25, 0.75])
    tiers = np.array([0.25, 0.25, 0.5, 1.0, 1.0])
    stats = accuracy_summary(acc, tiers, "final", True)
    assert stats == {"mean": 0.625, "worst": 0.25, "p10": 0.325, "median": 0.625, "best": 1.0,
                     "per_tier": {"0.25": 0.75, "1": 0.5}, "clients": 4, "width": "final", "masked": True}


def test_each_client_is_scored_on_its_labels_at_its_width(tmp_path):  # issue 25 item 2
    out = tmp_path / "run"
    engine = Engine(RunConfig(**SMALL, local_eval_every=2), out_dir=str(out))
    summary = engine.run()
    with open(out / "metrics.jsonl", encoding="utf-8") as handle:
        lines = [json.loads(line) for line in handle]
    assert ["local_accuracy_mean" in line for line in lines] == [False, True, False, True]
    assert lines[-1]["local_accuracy_mean"] == summary["local_accuracy"]["mean"]
    assert ["local_accuracy_worst" in line for line in lines] == [False, True, False, True]
    assert lines[-1]["local_accuracy_worst"] == summary["local_accuracy"]["worst"]
    with open(out / "clients.csv", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    params = engine.backend.get_params()
    dataset = load_plugin_dataset(lookup("dataset", "digits"), engine.config)
    hist = dataset.label_histograms()
    masked, unmasked = [], []
    for row in rows:  # one model and one pass per client, the plain way
        client, width = int(row["client"]), float(row["local_width"])
        assert width == float(row["p_final"])
        model = build_model("digits", width)
        specs = model.param_specs()
        with torch.no_grad():
            for name, param in model.named_parameters():
                param.copy_(extract(params[name], specs[name], width))
        model.eval()
        held = torch.as_tensor(hist[client] > 0)
        right = right_unmasked = total = 0
        with torch.no_grad():
            for x, y in dataset.test_batches(500):  # the evaluation batches (BatchNorm uses batch statistics)
                logits = model(x)
                keep = held[y]
                right += int((logits.masked_fill(~held, -torch.inf).argmax(1) == y)[keep].sum())
                right_unmasked += int((logits.argmax(1) == y)[keep].sum())
                total += int(keep.sum())
        assert int(row["local_test_samples"]) == total
        assert float(row["local_accuracy"]) == right / total
        assert float(row["local_accuracy_unmasked"]) == right_unmasked / total
        masked.append(right / total)
        unmasked.append(right_unmasked / total)
    assert summary["local_accuracy"]["mean"] == pytest.approx(np.mean(masked), abs=1e-15)
    assert summary["local_accuracy"]["worst"] == min(masked)
    assert summary["local_accuracy_unmasked"]["best"] == max(unmasked)
    assert all(m >= u for m, u in zip(masked, unmasked))  # masking only removes competitors
    tiers = {float(row["p_max"]) for row in rows}
    assert set(summary["local_accuracy"]["per_tier"]) == {format(t, "g") for t in tiers}


def test_p_max_width_synthetic_and_text(tmp_path):  # issue 25 item 2
    engine = Engine(RunConfig(**{**SMALL, "rounds": 2}, algorithm="hasfl", local_eval_width="p_max",
                              dataset="synthetic"), out_dir=str(tmp_path / "syn"))
    summary = engine.run()
    assert summary["local_accuracy"]["width"] == "p_max" and summary["local_accuracy"]["clients"] == 6
    with open(tmp_path / "syn" / "clients.csv", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    assert [row["local_width"] for row in rows] == [row["p_max"] for row in rows]
    # a text dataset: the summary says why, the clients.csv cells are empty, never a silent zero
    from hasfl_ray.data import TextFederatedDataset

    stream = (torch.arange(300, dtype=torch.uint8) * 7) % 95
    engine.dataset = TextFederatedDataset("s", "shakespeare", 95, stream, [torch.arange(0, 10)] * 6,
                                          torch.arange(100, 123), [f"r{i}" for i in range(6)], seq_len=80)
    engine.local = None
    assert engine.evaluation_summary()["local_accuracy"] == TEXT_LOCAL_ACCURACY
    assert TEXT_LOCAL_ACCURACY.startswith("not defined for this dataset: ")
