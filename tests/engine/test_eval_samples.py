"""eval_samples: evaluation on a seeded subset of the test set, the same every round; the default (the whole test
set) unchanged. The Ray backend's agreement is in tests/simulation/test_backend.py."""

import json
import os

import pytest
import torch
from click.testing import CliRunner

from hasfl_ray.cli.main import main
from hasfl_ray.data import TensorFederatedDataset, TextFederatedDataset, load_plugin_dataset
from hasfl_ray.data.base import FederatedDataset
from hasfl_ray.engine import Engine, RunConfig
from hasfl_ray.engine.checkpoint import config_differences
from hasfl_ray.errors import ConfigError
from hasfl_ray.models import build_model
from hasfl_ray.registry import lookup
from hasfl_ray.training.evaluate import evaluate, evaluation_subset
from hasfl_ray.engine.records import TIMINGS

DIGITS = dict(rounds=3, clients=10, clients_per_round=5, seed=3, backend="local")


def metrics(run_dir):
    with open(os.path.join(run_dir, "metrics.jsonl"), encoding="utf-8") as handle:
        return [{k: v for k, v in json.loads(line).items() if k != "wall_s"} for line in handle]


def without_wall(summary):
    return {k: v for k, v in summary.items() if k not in TIMINGS}


def test_the_subset_is_seeded_sorted_and_distinct():
    a = evaluation_subset(7, 1000, 100)
    assert a.dtype == torch.int64 and a.numel() == 100 and a.unique().numel() == 100
    assert torch.equal(a, a.sort().values) and 0 <= int(a.min()) and int(a.max()) < 1000
    assert torch.equal(a, evaluation_subset(7, 1000, 100))  # drawn from the seed alone: every round, every backend
    assert not torch.equal(a, evaluation_subset(8, 1000, 100))
    assert evaluation_subset(7, 1000, None) is None  # the whole test set
    assert evaluation_subset(7, 1000, 1000) is None and evaluation_subset(7, 1000, 5000) is None


def tensor_dataset():
    generator = torch.Generator().manual_seed(0)
    test_x = torch.randint(0, 256, (23, 3, 4, 4), dtype=torch.uint8, generator=generator)
    return TensorFederatedDataset("t", "t", 5, test_x[:4], torch.arange(4) % 5, test_x, torch.arange(23) % 5,
                                  [torch.arange(4)], mean=(0.1, 0.5, 0.9), std=(0.2, 0.3, 0.4))


def text_dataset():
    stream = (torch.arange(300, dtype=torch.uint8) * 7) % 95
    return TextFederatedDataset("s", "shakespeare", 95, stream, [torch.arange(0, 10)], torch.arange(100, 123),
                                ["a"], seq_len=80)


def synthetic_dataset():
    return load_plugin_dataset(lookup("dataset", "synthetic"), RunConfig(backend="local", dataset="synthetic", clients=30).resolved())


@pytest.mark.parametrize("make", [tensor_dataset, text_dataset, synthetic_dataset])
@pytest.mark.parametrize("generic", [False, True], ids=["own", "base-class default"])
def test_subset_batches_are_the_chosen_test_samples_in_order(make, generic):
    dataset = make()
    xs, ys = zip(*dataset.test_batches(5))
    whole_x, whole_y = torch.cat(xs), torch.cat(ys)
    indices = evaluation_subset(1, dataset.test_size, 11)
    gather = FederatedDataset.test_subset_batches if generic else type(dataset).test_subset_batches
    batches = list(gather(dataset, indices, 4))
    assert [len(y) for _, y in batches] == [4, 4, 3]
    assert torch.equal(torch.cat([x for x, _ in batches]), whole_x[indices])
    assert torch.equal(torch.cat([y for _, y in batches]), whole_y[indices])


@pytest.fixture(scope="module")
def default_run(tmp_path_factory):
    """DIGITS evaluated on the whole test set (the default), run once for the tests that compare with it: its
    summary and folder."""
    out = tmp_path_factory.mktemp("default") / "default"
    return Engine(RunConfig(**DIGITS), out_dir=str(out)).run(), out


def test_the_default_evaluates_the_whole_test_set_as_before(tmp_path, default_run):
    reference, default = default_run
    assert "eval_samples" not in reference
    for name, samples in (("zero", 0), ("more", 10 ** 6)):  # 0, or at least the test set: the whole test set
        config = RunConfig(**DIGITS, eval_samples=samples)
        summary = Engine(config, out_dir=str(tmp_path / name)).run()
        assert metrics(tmp_path / name) == metrics(default)
        assert summary["params_sha256"] == reference["params_sha256"]
    assert RunConfig(backend="local", eval_samples=0).eval_samples is None  # one spelling of "the whole test set" in config.yaml


def test_accuracy_on_the_subset_equals_a_direct_computation_and_training_is_untouched(tmp_path, default_run):
    reference = default_run[0]
    engine = Engine(RunConfig(**DIGITS, eval_samples=100), out_dir=str(tmp_path / "subset"))
    summary = engine.run()
    assert summary["params_sha256"] == reference["params_sha256"]  # only evaluation changes
    assert summary["eval_samples"] == 100
    assert "eval_samples: 100" in (tmp_path / "subset" / "config.yaml").read_text()
    # the final model on the 100 test images the seed picks, by hand (one batch: eval_batch_size 500 > 100)
    dataset = engine.dataset
    indices = evaluation_subset(3, dataset.test_size, 100)
    model = build_model(engine.model_name)
    with torch.no_grad():
        for name, param in model.named_parameters():
            param.copy_(engine.backend.get_params()[name])
    model.eval()
    x = torch.cat([x for x, _ in dataset.test_batches(500)])[indices]
    y = torch.cat([y for _, y in dataset.test_batches(500)])[indices]
    with torch.no_grad():
        logits = model(x)
    last = metrics(tmp_path / "subset")[-1]
    assert last["test_accuracy"] == int((logits.argmax(1) == y).sum()) / 100
    assert last["test_loss"] == pytest.approx(float(torch.nn.functional.cross_entropy(logits, y)), rel=1e-6)
    # the same subset every round: evaluating the same model again gives the same figures
    assert engine.backend.evaluate() == engine.backend.evaluate() == (last["test_accuracy"], last["test_loss"])
    assert evaluate(model, dataset, 500, indices)[0] == last["test_accuracy"]


def test_eval_samples_is_part_of_the_config_that_resume_compares(tmp_path):
    assert config_differences(RunConfig(**DIGITS).to_dict(), RunConfig(**DIGITS, eval_samples=50)) == \
        ["eval_samples None -> 50"]
    stored = RunConfig(**DIGITS).to_dict()
    del stored["eval_samples"]  # a run written before the option existed evaluated the whole test set
    assert config_differences(stored, RunConfig(**DIGITS)) == []
    config = RunConfig(**{**DIGITS, "rounds": 2}, eval_samples=50, checkpoint_every=1)
    out = str(tmp_path / "run")
    Engine(config, out_dir=out).run()
    with pytest.raises(ConfigError, match=r"different config \(eval_samples 50 -> 60\)"):
        Engine(RunConfig(**{**DIGITS, "rounds": 2}, eval_samples=60), out_dir=out, resume=True).prepare()
    resumed = Engine(RunConfig(**DIGITS, eval_samples=50, checkpoint_every=1), out_dir=out, resume=True,
                     force=True).run()
    straight = Engine(RunConfig(**DIGITS, eval_samples=50), out_dir=str(tmp_path / "straight")).run()
    # the 2-round run's last line also holds its local accuracy (issue 25: evaluated after the last round)
    local = ("local_accuracy_mean", "local_accuracy_worst")
    assert [{k: v for k, v in line.items() if k not in local} for line in metrics(out)] == \
        [{k: v for k, v in line.items() if k not in local} for line in metrics(tmp_path / "straight")]
    assert without_wall(resumed) == without_wall(straight)


@pytest.mark.parametrize("value", [-5, 2.5, True, "ten"])
def test_bad_values_are_refused_in_one_sentence(value):
    with pytest.raises(ConfigError) as info:
        RunConfig(backend="local", eval_samples=value)
    assert str(info.value).startswith(f"eval_samples is {value!r}; expected a positive integer")
    assert "\n" not in str(info.value)


def test_the_cli_flag_reaches_the_run(tmp_path):
    out = tmp_path / "run"
    result = CliRunner().invoke(main, ["simulate", "--rounds", "1", "--clients", "6", "--clients-per-round", "2",
                                       "--backend", "local", "--eval-samples", "50", "--out", str(out), "--quiet"])
    assert result.exit_code == 0, result.output
    assert json.loads((out / "summary.json").read_text())["eval_samples"] == 50
    assert "eval_samples: 50" in (out / "config.yaml").read_text()
