"""The bad-input battery: every command, each mistake a user makes ends in exit status 2 and one sentence under
200 characters naming the thing, the value and what is expected, with no traceback and nothing left on disk."""

import os

import pytest
import torch
from click.testing import CliRunner

from hasfl_ray.cli.main import main

BASE = ["--backend", "local", "--quiet"]
LOCAL = [*BASE, "--out", "run"]
POLICY = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "loss_policy.py") + ":LossPolicy"
#: More clients than any machine's memory holds (176 bytes a client: 1.76 PB).
TOO_MANY = "10000000000000"

# (arguments, words the sentence must contain); run in an empty working directory holding the files made below
CASES = [
    # simulate: flags
    (["simulate", "--rounds", "0", *LOCAL], ["rounds is 0", "positive integer"]),
    (["simulate", "--rounds", "many", *LOCAL], ["--rounds", "many"]),
    (["simulate", "--roudns", "3", *LOCAL], ["--roudns", "--rounds"]),
    (["simulate", "--algorithm", "hasfll", *LOCAL], ["hasfll", "did you mean 'hasfl'"]),
    (["simulate", "--algorithm", "nonsense", *LOCAL], ["nonsense", "expected one of"]),
    (["simulate", "--dataset", "emnst", *LOCAL], ["emnst", "did you mean 'emnist'"]),
    (["simulate", "--clients", "-3", *LOCAL], ["clients is -3", "positive integer"]),
    (["simulate", "--clients", "4", "--clients-per-round", "9", *LOCAL], ["clients_per_round is 9", "at most"]),
    (["simulate", "--lr", "-0.1", *LOCAL], ["lr is -0.1", "> 0"]),
    (["simulate", "--momentum", "1.5", *LOCAL], ["momentum is 1.5", "[0, 1]"]),
    (["simulate", "--p-min", "0", *LOCAL], ["p_min is 0.0", "(0, 1]"]),
    (["simulate", "--beta", "2", *LOCAL], ["beta is 2.0", "[0, 1]"]),
    (["simulate", "--warmup", "-1", *LOCAL], ["warmup is -1", "non-negative"]),
    (["simulate", "--alpha", "0", *LOCAL], ["alpha is 0.0", "> 0"]),
    (["simulate", "--seed", "-5", *LOCAL], ["seed is -5", "non-negative"]),
    (["simulate", "--budget", "1.5", "--algorithm", "random-budget", *LOCAL], ["budget is 1.5", "(0, 1]"]),
    (["simulate", "--budget", "0.9", "--algorithm", "random-budget", *LOCAL], ["budget is 0.9", "average between"]),
    (["simulate", "--budget", "0.5", "--budget-from", "x", "--algorithm", "random-budget", *LOCAL],
     ["--budget 0.5", "--budget-from"]),
    (["simulate", "--algorithm", "random-budget", "--budget-from", "nowhere", *LOCAL], ["nowhere", "summary.json"]),
    (["simulate", "--device", "tpu", *LOCAL], ["device is 'tpu'", "cuda"]),
    (["simulate", "--client-batching", "sometimes", *LOCAL], ["sometimes", "auto"]),
    (["simulate", "--cuda-graphs", "always", *LOCAL], ["cuda_graphs is 'always'", "auto, on or off"]),
    (["simulate", "--precision", "fp16", *LOCAL], ["precision is 'fp16'", "fp32 or bf16"]),
    (["simulate", "--aggregation-backend", "magic", *LOCAL], ["magic", "fused"]),
    (["simulate", "--heterofl-weighting", "equal", *LOCAL], ["equal", "samples"]),
    (["simulate", "--trainer-threads", "0", *LOCAL], ["trainer_threads is 0", "positive integer"]),
    (["simulate", "--checkpoint-every", "-2", *LOCAL], ["checkpoint_every is -2", "non-negative"]),
    (["simulate", "--eval-samples", "-5", *LOCAL], ["eval_samples is -5", "positive integer"]),
    (["simulate", "--eval-samples", "1e4", *LOCAL], ["--eval-samples", "1e4"]),
    (["simulate", "--actors", "2", *LOCAL], ["actors is 2", "backend ray"]),
    (["simulate", "--fault-inject", "explode@3", "--backend", "ray", "--quiet", "--out", "run"],
     ["fault_inject is 'explode@3'", "ROUND"]),
    (["simulate", "--dataset", "emnist", "--data-dir", "afile.txt", *LOCAL], ["afile.txt", "is a file", "directory"]),
    (["simulate", "--dataset", "emnist", "--data-dir", "empty", *LOCAL], ["emnist", "empty"]),
    (["simulate", "--dataset", "cifar10", "--data-dir", "empty", *LOCAL], ["cifar", "empty"]),
    (["simulate", "--dataset", "shakespeare", "--data-dir", "empty", *LOCAL], ["empty"]),
    (["simulate", "--out", "existing", "--backend", "local", "--quiet"], ["existing", "already holds a run"]),
    # an option of another algorithm, from a flag (a config file's is dropped: docs/configs.md)
    (["simulate", "--mu", "0.5", *LOCAL], ["mu is 0.5 but algorithm 'hasfl' takes no option 'mu'", "fedprox"]),
    (["simulate", "--algorithm", "fedavg", "--no-coverage", *LOCAL],
     ["coverage is False but algorithm 'fedavg' takes no option 'coverage'", "hasfl or random-budget"]),
    (["simulate", "--algorithm", "heterofl", "--algo-opt", "mu=1", *LOCAL],
     ["algorithm option 'mu' is unknown to 'heterofl'", "heterofl_weighting"]),
    # simulate: numbers that are not finite or overflow float32 (refused by RunConfig before any folder exists)
    (["simulate", "--lr", "1e308", *LOCAL], ["lr is 1e+308", "at most 1000"]),
    (["simulate", "--lr", "inf", *LOCAL], ["lr is inf", "at most 1000"]),
    (["simulate", "--gamma", "nan", *LOCAL], ["gamma is nan", "finite"]),
    (["simulate", "--algorithm", "fedprox", "--mu", "1e39", *LOCAL], ["mu is 1e+39", "3.4e+38"]),
    (["simulate", "--algorithm", "scaffold", "--scaffold-global-lr", "1e9", *LOCAL],
     ["scaffold_global_lr is 1000000000.0", "at most 1000"]),
    (["simulate", "--algorithm", POLICY, "--algo-opt", "gain=.nan", *LOCAL], ["option 'gain' is nan", "finite"]),
    (["simulate", "--algorithm", POLICY, "--algo-opt", "min_width=.inf", *LOCAL],
     ["min_width is inf", "(0, 1]"]),
    (["simulate", "--dataset", "synthetic", "--clients", TOO_MANY, "--clients-per-round", "2", *LOCAL],
     [f"clients is {TOO_MANY}", "1.76 PB of memory", "176 bytes a client"]),
    # simulate: where the run directory cannot be (nothing made, not even the folder)
    (["simulate", *BASE, "--out", "afile.txt"], ["'afile.txt' is a file", "expected a folder"]),
    (["simulate", *BASE, "--out", "afile.txt/run"], ["'afile.txt/run' cannot be made", "'afile.txt' is a file"]),
    (["simulate", *BASE, "--out", "/proc/hasfl-ray-run"], ["'/proc/hasfl-ray-run' cannot be made in '/proc'"]),
    (["simulate", *BASE, "--out", "/dev/full"], ["'/dev/full' is a device; expected a folder"]),
    (["simulate", *BASE, "--out", "/"], ["'/' is the root folder"]),
    (["simulate", *BASE, "--out", ""], ["--out is ''", "folder path"]),
    *([(["simulate", "--device", "cuda", *LOCAL], ["device is 'cuda'", "no GPU"])]
      if not torch.cuda.is_available() else []),
    # simulate: config files
    (["simulate", "--config", "missing.yaml", *LOCAL], ["missing.yaml", "cannot be read"]),
    (["simulate", "--config", "typo.yaml", *LOCAL], ["roudns", "did you mean 'rounds'"]),
    (["simulate", "--config", "list.yaml", *LOCAL], ["list.yaml", "mapping"]),
    (["simulate", "--config", "broken.yaml", *LOCAL], ["broken.yaml", "not valid YAML"]),
    (["simulate", "--config", "python-tag.yaml", *LOCAL], ["python-tag.yaml", "never loaded"]),
    (["simulate", "--config", "wrong-type.yaml", *LOCAL], ["rounds is 'ten'", "positive integer"]),
    (["simulate", "--config", "lr-inf.yaml", *LOCAL], ["lr is inf", "at most 1000"]),
    (["simulate", "--config", "gamma-nan.yaml", *LOCAL], ["gamma is nan", "finite"]),
    (["simulate", "--config", "weight-decay-nan.yaml", *LOCAL], ["weight_decay is nan", "finite"]),
    (["simulate", "--config", "clip-nan.yaml", *LOCAL], ["clip_norm is nan", "finite"]),
    (["simulate", "--config", "alpha-inf.yaml", *LOCAL], ["alpha is inf", "finite"]),
    (["simulate", "--config", "mu-inf.yaml", *LOCAL], ["mu is inf", "finite"]),
    (["simulate", "--config", "p-min-nan.yaml", *LOCAL], ["p_min is nan", "(0, 1]"]),
    (["simulate", "--config", "huge-int.yaml", *LOCAL], ["weight_decay is 1000000", "characters", "finite"]),
    (["simulate", "--config", "option-nan.yaml", *LOCAL], ["option 'gain' is nan", "finite"]),
    (["simulate", "--config", "duplicate.yaml", *LOCAL], ["duplicate.yaml", "key 'lr' twice", "line 3"]),
    (["simulate", "--config", "duplicate-spelling.yaml", *LOCAL],
     ["key 'local_epochs' twice", "'local-epochs' and 'local_epochs'"]),
    (["simulate", "--config", "random-bytes.yaml", *LOCAL], ["random-bytes.yaml", "not UTF-8 text"]),
    # report, plot, analyze
    (["report"], ["Missing argument"]),
    (["report", "empty"], ["no finished runs", "empty"]),
    (["report", "half-run"], ["half-run", "clients.csv"]),
    (["plot", "empty"], ["no finished runs", "empty"]),
    (["analyze"], ["Missing argument"]),
    (["analyze", "empty"], ["no finished runs", "empty"]),
    (["analyze", "half-run"], ["half-run", "clients.csv"]),
    # sweep
    (["sweep", "missing.yaml"], ["missing.yaml", "sweep YAML"]),
    (["sweep", "typo.yaml", "--out", "sweep"], ["roudns", "did you mean 'rounds'"]),
    (["sweep", "python-tag.yaml", "--out", "sweep"], ["never loaded"]),
    (["sweep", "duplicate.yaml", "--out", "sweep"], ["duplicate.yaml", "key 'lr' twice"]),
    (["sweep", "random-bytes.yaml", "--out", "sweep"], ["random-bytes.yaml", "not UTF-8 text"]),
    (["sweep", "gamma-nan.yaml", "--backend", "local", "--out", "sweep"], ["gamma is nan", "finite"]),
    (["sweep", "plain.yaml", "--seeds", "x", "--out", "sweep"], ["--seeds is 'x'", "comma-separated"]),
    (["sweep", "plain.yaml", "--algorithms", "hasfll", "--out", "sweep"], ["hasfll", "did you mean 'hasfl'"]),
    (["sweep", "plain.yaml", "--rounds", "0", "--out", "sweep"], ["rounds is 0", "positive integer"]),
    # cost
    (["cost", "--model", "resnet"], ["resnet", "emnist"]),
    (["cost", "--model", "digits", "--widths", "0.5,1.5"], ["widths", "1.5", "(0, 1]"]),
    # bench
    (["bench", "aggregate", "--clients", "ten"], ["clients", "ten"]),
    (["bench", "aggregate", "--models", "resnet"], ["resnet"]),
    (["bench", "aggregate", "--repeats", "0"], ["--repeats", "0"]),
    (["bench", "aggregate", "--device", "tpu"], ["--device", "tpu"]),
    (["bench", "nothing"], ["nothing"]),
    # data inspect
    (["data", "inspect", "--dataset", "mnist"], ["mnist", "emnist"]),
    (["data", "inspect", "--dataset", "emnist", "--data-dir", "empty"], ["emnist", "empty"]),
    (["data", "inspect", "--clients", "0"], ["--clients", "0"]),
    (["data", "inspect", "--alpha", "-1"], ["--alpha", "-1"]),
    (["data", "inspect", "--dataset", "synthetic", "--clients", TOO_MANY], [f"clients is {TOO_MANY}", "memory"]),
    # info and the group itself
    (["info", "--verbose"], ["--verbose"]),
    (["simulat"], ["simulat", "simulate"]),
]


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    """An empty working directory with the files the cases name; returns the listing to compare against."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "afile.txt").write_text("not a directory\n")
    (tmp_path / "empty").mkdir()
    (tmp_path / "typo.yaml").write_text("roudns: 3\n")
    (tmp_path / "list.yaml").write_text("- rounds\n- 3\n")
    (tmp_path / "broken.yaml").write_text("rounds: [1,\n")
    (tmp_path / "python-tag.yaml").write_text('rounds: !!python/object/apply:os.system ["touch pwned"]\n')
    (tmp_path / "wrong-type.yaml").write_text("rounds: ten\n")
    (tmp_path / "plain.yaml").write_text("dataset: digits\nrounds: 2\n")
    (tmp_path / "half-run").mkdir()
    (tmp_path / "half-run" / "summary.json").write_text("{}")
    (tmp_path / "half-run" / "config.yaml").write_text("dataset: digits\n")
    (tmp_path / "existing").mkdir()
    (tmp_path / "existing" / "config.yaml").write_text("dataset: digits\n")
    for name, text in {"lr-inf": "lr: .inf", "gamma-nan": "gamma: .nan", "weight-decay-nan": "weight_decay: .nan",
                       "clip-nan": "clip_norm: .nan", "alpha-inf": "alpha: .inf", "mu-inf": "mu: .inf",
                       "p-min-nan": "p_min: .NaN", "huge-int": "weight_decay: 1" + "0" * 400,
                       "option-nan": f"algorithm: {POLICY}\nalgorithm_options: {{gain: .nan}}"}.items():
        (tmp_path / f"{name}.yaml").write_text(f"dataset: digits\nrounds: 2\n{text}\n")
    (tmp_path / "duplicate.yaml").write_text("dataset: digits\nlr: 0.05\nlr: 5.0\n")
    (tmp_path / "duplicate-spelling.yaml").write_text("local-epochs: 1\nlocal_epochs: 2\n")
    (tmp_path / "random-bytes.yaml").write_bytes(bytes([0x84, 0xff, 0x00, 0x9c]) + bytes(range(256)))
    return tmp_path


def listing(root):
    return sorted(os.path.relpath(os.path.join(d, f), root) for d, dirs, files in os.walk(root) for f in files + dirs)


def test_the_battery_has_at_least_forty_cases_over_every_command():
    assert len(CASES) >= 40
    commands = {tuple(a[:2]) if a[0] in ("bench", "data") else a[0] for a, _ in CASES}
    assert {"simulate", "sweep", "report", "analyze", "plot", "cost", ("bench", "aggregate"), ("data", "inspect"),
            "info"} <= commands


@pytest.mark.parametrize("args, words", CASES, ids=[" ".join(a)[:60] for a, _ in CASES])
def test_bad_input_is_one_sentence_with_exit_status_2(workdir, args, words):
    before = listing(workdir)
    result = CliRunner().invoke(main, args)
    message = result.output.strip()
    assert result.exit_code == 2, message
    assert "Traceback" not in message and not isinstance(result.exception, Exception) or \
        isinstance(result.exception, SystemExit), message
    assert len(message.splitlines()) == 1 and message.startswith("Error: "), message
    assert len(message) < 200 + len("Error: "), message
    for word in words:
        assert word in message, (word, message)
    assert listing(workdir) == before  # nothing written, not even an empty run directory
