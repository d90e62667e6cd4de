"""A version-2 run (written before issue 35 made the sources' rules defaults) resumes evaluated as it ran: its sBN
statistics pass is the earlier one, client after client in the evaluation's batches of ``eval_batch_size`` (500),
which config_version 3 calls ``sbn_statistics: in_order`` (hasfl_ray/config/migrate.py::_version_2_rules).

tests/engine/data/v2-runs/ holds what hasfl-ray at commit 9669a22 (config_version 2, the parent of d283c68, the first
commit of issue 35) wrote on the machine type of ``v2-runs/machine.json``, with::

    hasfl-ray simulate --backend local --dataset digits --model preresnet18 --algorithm heterofl \\
        --width-mix a1-b1-c1-d1-e1 --width-assignment dynamic --partition classes:2 --clients 10 \\
        --clients-per-round 3 --rounds 4 --seed 5 [--checkpoint-every 1 --fault-inject trainer-error@2]

- ``heterofl-sbn/``: the stopped run's config.yaml and metrics.jsonl (rounds 0 and 1, then a trainer error in round
  2); its 45 MB checkpoint is not stored: :func:`write_version_2_run` makes it here with today's code (the same
  training, so the same bits on that machine type: its params_sha256 is checked against the one recorded);
- ``heterofl-sbn-uninterrupted.jsonl``: the metrics.jsonl of the same run without the interruption, whose
  ``accuracy_at_width`` at rounds 2 and 3 the resumed run must reproduce at every width.

Before the fix the in-order pass read batches of ``sbn_batch_size`` (10) and the resumed rounds differed from the
recorded ones by up to 3 test images a width here (0.1504 against 0.1588 at width 1/8 in round 3).
"""

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from click.testing import CliRunner

import hasfl_ray
from hasfl_ray.cli.main import main
from hasfl_ray.config import RunConfig, migrate_config
from hasfl_ray.engine.checkpoint import load_checkpoint, save_checkpoint
from hasfl_ray.engine.server import params_sha256
from hasfl_ray.engine.statistics import pass_batches, statistics_plan
from hasfl_ray.errors import TrainerError
from tests.engine.recorded_machine import other_machine

V2_RUNS = Path(__file__).parent / "data" / "v2-runs"
RUN = V2_RUNS / "heterofl-sbn"
RECORDED = json.loads((V2_RUNS / "machine.json").read_text(encoding="utf-8"))


def stored_config():
    return yaml.safe_load((RUN / "config.yaml").read_text(encoding="utf-8"))


def jsonl(path):
    return [json.loads(line) for line in Path(path).read_text(encoding="utf-8").splitlines()]


def write_version_2_run(path):
    """The stored version-2 run directory at ``path``, its checkpoint made here: today's code runs the stored config as
    migrated, stopped as the old run was (a checkpoint after rounds 0 and 1, a trainer error in round 2); then
    config.yaml, metrics.jsonl and the checkpoint's config and history are what commit 9669a22 wrote."""
    stored = stored_config()
    assert stored["config_version"] == 2 and "sbn_statistics" not in stored
    with pytest.raises(TrainerError, match="trainer-error@2"):
        hasfl_ray.simulate(RunConfig.from_dict(migrate_config(stored)), out_dir=str(path))  # a whole config
    for name in ("config.yaml", "metrics.jsonl"):
        shutil.copy(RUN / name, path / name)
    checkpoint = load_checkpoint(str(path))
    assert checkpoint.round == 2
    checkpoint.config, checkpoint.history = stored, jsonl(RUN / "metrics.jsonl")
    save_checkpoint(str(path), checkpoint)
    return path, checkpoint


def test_a_version_2_run_resumes_with_the_accuracy_it_recorded_at_every_width(tmp_path):
    reason = other_machine(V2_RUNS / "machine.json")
    if reason:
        pytest.skip(f"the version-2 run was written on another machine type ({reason}); its checkpoint is remade here "
                    "and its accuracies are bit-for-bit only on that type. The pass it ran with is checked on every "
                    "machine by test_a_version_2_configs_pass_is_the_earlier_one")
    run, checkpoint = write_version_2_run(tmp_path / "run")
    assert params_sha256(checkpoint.params) == RECORDED["checkpoint_params_sha256"]  # the directory 9669a22 left
    result = CliRunner().invoke(main, ["simulate", "--out", str(run), "--resume", "--quiet"])
    assert result.exit_code == 0, result.output
    resumed = yaml.safe_load((run / "config.yaml").read_text(encoding="utf-8"))
    assert resumed["sbn_statistics"] == "in_order" and resumed["partition"] == "classes-even:2"
    lines, recorded = jsonl(run / "metrics.jsonl"), jsonl(V2_RUNS / "heterofl-sbn-uninterrupted.jsonl")
    assert [line["round"] for line in lines] == [0, 1, 2, 3]
    for ours, theirs in zip(lines, recorded):  # rounds 2 and 3 evaluated today, 0 and 1 kept as written
        assert ours["accuracy_at_width"] == theirs["accuracy_at_width"], ours["round"]
        assert ours["test_accuracy"] == theirs["test_accuracy"]
    summary = json.loads((run / "summary.json").read_text(encoding="utf-8"))
    assert summary["params_sha256"] == RECORDED["final_params_sha256"]


def earlier_pass(dataset, batch_size):
    """The pass of commit 9669a22 (hasfl_ray/models/resnet.py::training_batches, called by Server._statistics with
    the server's eval_batch_size), written out: every client's samples, client after client in its sample order,
    cut into batches of ``batch_size`` across client boundaries; a last batch of one sample left out."""
    xs, ys = [], []
    for client in range(dataset.num_clients):
        x, y = dataset.client_batch(client, torch.arange(dataset.client_size(client)))
        xs.append(x)
        ys.append(y)
    x, y = torch.cat(xs), torch.cat(ys)
    return [(x[s:s + batch_size], y[s:s + batch_size]) for s in range(0, len(y), batch_size) if len(y[s:]) >= 2]


def test_a_version_2_configs_pass_is_the_earlier_one():
    """On any machine: the migrated config's plan reads the earlier pass's batches, 500 at a time, not
    sbn_batch_size's 10."""
    config = RunConfig.from_dict(migrate_config(stored_config())).resolved()
    plan = statistics_plan(config)
    assert (plan.mode, plan.batch_size, plan.data) == ("in_order", 500, "clients") and config.sbn_batch_size == 10
    dataset = hasfl_ray.data.load_dataset("digits", config.clients, config.alpha, config.seed,
                                          partition=config.partition)
    ours, theirs = list(pass_batches(dataset, plan)), earlier_pass(dataset, 500)
    assert len(ours) == len(theirs) == int(np.ceil(dataset.train_size / 500))
    for (x, y), (x0, y0) in zip(ours, theirs):
        assert torch.equal(x, x0) and torch.equal(y, y0)
