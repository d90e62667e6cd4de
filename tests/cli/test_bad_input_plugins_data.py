"""The bad-input battery for plug-ins, dataset files, YAML and `bench aggregate` (issue 24): a plug-in's SystemExit,
odd return values or failing dataset loader, an empty or mis-shaped data split, a FIFO where a file goes, a YAML
alias bomb and a benchmark too large for memory each end in one sentence and a non-zero exit, never a silent
success, a traceback, a hang or gigabytes of memory."""

import logging
import os
import textwrap
import tracemalloc

import numpy as np
import pytest
from click.testing import CliRunner

from data.dataset_files import make_cifar_root, make_emnist_root, write_idx
from hasfl_ray.cli.main import main
from hasfl_ray.config import load_yaml_config
from hasfl_ray.engine.guard import GuardedAlgorithm
from hasfl_ray.errors import ConfigError, PluginError
from deadlines import deadline

TINY = ["simulate", "--backend", "local", "--rounds", "2", "--clients", "6", "--clients-per-round", "3", "--quiet"]


def invoke(args):
    with deadline():
        return CliRunner().invoke(main, args)


def one_sentence(result, status, *words):
    message = result.output.strip()
    assert result.exit_code == status, (result.exit_code, message, result.exception)
    assert message.startswith("Error: ") and len(message.splitlines()) == 1 and "Traceback" not in message, message
    for word in words:
        assert word in message, (word, message)
    return message


def algorithm(tmp_path, body, top=""):
    path = tmp_path / "plug.py"
    path.write_text("import sys\nimport numpy as np\nimport torch\nfrom hasfl_ray.algorithms.base import Algorithm\n"
                    + top + "\n\nclass Bad(Algorithm):\n" + textwrap.indent(body, "    ") + "\n")
    return f"{path}:Bad"


# ---- row 10: SystemExit (and other BaseExceptions) from a plug-in ------------------------------------------------

def test_a_plugin_that_exits_at_import_is_one_sentence_and_exit_2(tmp_path):
    # issue 24 row 10
    spec = algorithm(tmp_path, "pass", top="sys.exit(0)")
    out = tmp_path / "p"
    message = one_sentence(invoke(TINY + ["--algorithm", spec, "--out", str(out)]), 2, "plug.py", "fails to import",
                           "SystemExit")
    assert "exit code 0" in message
    assert not out.exists()


@pytest.mark.parametrize("body, method, status", [
    ("def __init__(self, *a):\n    sys.exit(0)", "__init__()", 1),
    ("def allocate(self, round, participants):\n    if round == 1: sys.exit(0)\n"
     "    return super().allocate(round, participants)", "allocate()", 1),
    ("def observe(self, round, results, aggregate):\n    raise GeneratorExit", "observe()", 1),
    ("def h_tilde(self):\n    raise SystemExit('bye')", "h_tilde()", 1),
])
def test_a_plugin_that_exits_in_a_method_is_one_sentence_and_a_failure(tmp_path, body, method, status):
    # issue 24 row 10: never exit status 0 without a word
    out = tmp_path / "p"
    message = one_sentence(invoke(TINY + ["--algorithm", algorithm(tmp_path, body), "--out", str(out)]), status,
                           "algorithm 'Bad'", method)
    assert "SystemExit" in message or "GeneratorExit" in message
    assert not (out / "summary.json").exists()
    if method != "__init__()":
        assert "Traceback" in (out / "log.txt").read_text()


def test_a_keyboard_interrupt_in_a_plugin_still_stops_the_run():
    # issue 24 row 10: Ctrl-C is the user's stop, never converted into the plug-in's failure
    class Stops:
        def observe(self, *args):
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        GuardedAlgorithm(Stops(), "Stops").observe(0, [], None)


# ---- rows 12 and 25: what a plug-in returns is read inside the guard and checked for length ------------------------

RETURNS = {
    "h_tilde_short": ("def h_tilde(self):\n    return np.ones(2)", ["h_tilde()", "one number per client (6)"]),
    "h_tilde_2d": ("def h_tilde(self):\n    return np.ones((6, 2))", ["h_tilde()", "one number per client (6)"]),
    "h_tilde_text": ("def h_tilde(self):\n    return ['a'] * 6", ["h_tilde()", "one number per client"]),
    "p_current_short": ("def allocate(self, round, participants):\n    return {i: 1.0 for i in participants}\n"
                        "def observe(self, round, results, aggregate):\n    self.p_current = self.p_current[:2]",
                        ["p_current", "one number per client (6)"]),
    "weights_meta": ("def aggregation_weights(self, clients):\n    return torch.ones(len(clients), device='meta')",
                     ["aggregation_weights()", "when read", "expected a list of numbers"]),
    "weights_iter_raises": ("class W:\n    def __iter__(self):\n        raise RuntimeError('no')\n"
                            "def aggregation_weights(self, clients):\n    return self.W()",
                            ["aggregation_weights()", "RuntimeError", "expected a list of numbers"]),
    "allocate_float_raises": ("class Width(float):\n    def __float__(self):\n        raise ZeroDivisionError\n"
                              "def allocate(self, round, participants):\n"
                              "    return {i: self.Width(0.5) for i in participants}",
                              ["allocate()", "ZeroDivisionError"]),
    "objective_none": ("def objective(self, round, client, width):\n    return None",
                       ["objective()", "LocalObjective"]),
    "server_lr_property_raises": ("@property\ndef server_lr(self):\n    raise ValueError('lr?')",
                                  ["server_lr", "ValueError"]),
}


@pytest.mark.parametrize("case", sorted(RETURNS))
def test_a_plugins_odd_return_value_is_one_sentence_and_no_short_clients_csv(tmp_path, case):
    # issue 24 rows 12 and 25: never a truncated clients.csv, never an AttributeError from engine.py
    body, words = RETURNS[case]
    out = tmp_path / "p"
    one_sentence(invoke(TINY + ["--algorithm", algorithm(tmp_path, body), "--out", str(out)]), 1, "algorithm 'Bad'",
                 *words)
    assert not (out / "clients.csv").exists() and not (out / "summary.json").exists()


def test_h_tilde_as_a_list_of_one_number_per_client_is_read_as_those_numbers(tmp_path):
    # issue 24 row 25: a list is the numbers it holds (not an AttributeError); clients.csv has every client
    body = "def h_tilde(self):\n    return [0.5] * 6"
    out = tmp_path / "p"
    result = invoke(TINY + ["--algorithm", algorithm(tmp_path, body), "--out", str(out)])
    assert result.exit_code == 0, result.output
    rows = (out / "clients.csv").read_text().splitlines()
    assert len(rows) == 7 and all(",0.5," in row for row in rows[1:])


# ---- row 27: a dataset plug-in's failure is contained like an algorithm's -----------------------------------------

def dataset(tmp_path, body, defaults="dict(local_epochs=1, lr=0.05, clip_norm=10.0, batch_size=16)"):
    path = tmp_path / "dplug.py"
    path.write_text("import sys\nfrom hasfl_ray.data import load_dataset\nfrom hasfl_ray.data.base import Dataset\n\n"
                    f"class D(Dataset):\n    model = 'digits'\n    defaults = {defaults}\n"
                    + textwrap.indent(body, "    ") + "\n")
    return f"{path}:D"


@pytest.mark.parametrize("body, words", [
    ("def load(self, config):\n    raise RuntimeError('no data here')",
     ["dataset 'D' raised RuntimeError in load()", "no data here", "-v"]),
    ("def load(self, config):\n    sys.exit(3)", ["dataset 'D' raised SystemExit in load()", "exit code 3"]),
    ("def __init__(self):\n    raise KeyError('x')\ndef load(self, config):\n    pass",
     ["dataset 'D' raised KeyError in __init__()"]),
    ("def load(self, config):\n    return 'not a dataset'", ["dataset 'D' returned 'not a dataset' from load()",
                                                              "FederatedDataset"]),
    ("def load(self, config):\n    ds = load_dataset('digits', config.clients, 0.3, config.seed)\n"
     "    ds.client_sizes = lambda: [10, 10]\n    return ds", ["client_sizes()", "one per client (6)"]),
])
def test_a_dataset_plugins_failure_is_one_sentence_naming_it_and_the_method(tmp_path, body, words):
    # issue 24 row 27: no raw traceback; nothing is written for a run that cannot start
    out = tmp_path / "d"
    result = invoke(TINY + ["--dataset", dataset(tmp_path, body), "--out", str(out)])
    assert result.exit_code in (1, 2), result.output
    message = one_sentence(result, result.exit_code, *words)
    assert not out.exists(), message


def test_a_dataset_plugins_traceback_shows_with_v(tmp_path, caplog):
    # issue 24 row 27: the traceback is one flag away (logged at INFO, which -v shows; no run directory exists yet)
    spec = dataset(tmp_path, "def load(self, config):\n    raise RuntimeError('no data here')")
    caplog.set_level(logging.INFO)
    result = invoke(TINY + ["--dataset", spec, "--out", str(tmp_path / "d"), "-v"])
    assert result.exit_code == 1
    assert "Traceback" in caplog.text and "raise RuntimeError('no data here')" in caplog.text


def test_a_plugins_resolve_config_and_options_are_contained_too(tmp_path):
    # issue 24 rows 10 and 27 (cousins): the plug-in code that runs while the config is resolved
    body = "@classmethod\ndef resolve_config(cls, config):\n    sys.exit(0)"
    one_sentence(invoke(TINY + ["--algorithm", algorithm(tmp_path, body), "--out", str(tmp_path / "a")]), 1,
                 "algorithm 'Bad' raised SystemExit in resolve_config()", "exit code 0")
    top = ("import dataclasses\n@dataclasses.dataclass\nclass Opts:\n    k: int = 1\n"
           "    def __post_init__(self):\n        raise ValueError('k?')")
    (tmp_path / "other").mkdir()  # another file: a plug-in file is imported once a process
    one_sentence(invoke(TINY + ["--algorithm", algorithm(tmp_path / "other", "options_class = Opts", top=top),
                                "--out", str(tmp_path / "b")]), 1, "raised ValueError in options()", "k?")
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_a_dataset_plugin_without_defaults_names_the_missing_setting(tmp_path):
    # issue 24 row 27 (a cousin): no lr anywhere used to be a TypeError traceback in the first round
    body = "def load(self, config):\n    return load_dataset('digits', config.clients, 0.3, config.seed)"
    one_sentence(invoke(TINY + ["--dataset", dataset(tmp_path, body, "{}"), "--out", str(tmp_path / "d")]), 2,
                 "is not set and dataset", "gives no default for it", "defaults = dict(")
    assert not (tmp_path / "d").exists()


def test_a_dataset_plugins_test_batches_that_raise_end_the_run_in_one_sentence(tmp_path):
    # issue 24 row 27: the evaluation reads the plug-in's test set every round
    body = ("def load(self, config):\n    ds = load_dataset('digits', config.clients, 0.3, config.seed)\n"
            "    def test_batches(batch_size):\n        sys.exit(4)\n        yield\n"
            "    ds.test_batches = test_batches\n    return ds")
    out = tmp_path / "d"
    one_sentence(invoke(TINY + ["--dataset", dataset(tmp_path, body), "--out", str(out)]), 1,
                 "evaluating the global model failed (SystemExit")
    assert "Traceback" in (out / "log.txt").read_text() and not (out / "summary.json").exists()


# ---- rows 11 and 32: empty or mis-shaped splits --------------------------------------------------------------------

EMNIST = ["--dataset", "emnist", "--clients", "4", "--clients-per-round", "2"]


def emnist_args(root, out):
    return ["simulate", "--backend", "local", "--rounds", "1", "--quiet", *EMNIST, "--data-dir", str(root),
            "--out", str(out)]


@pytest.mark.parametrize("split", ["test", "train"])
def test_an_empty_emnist_split_is_refused_before_the_run_starts(tmp_path, split):
    # issue 24 row 11: a test split of 0 images used to give accuracy 0.0 every round and a "successful" run
    make_emnist_root(tmp_path / "data")
    raw = tmp_path / "data" / "EMNIST" / "raw"
    write_idx(raw / f"emnist-byclass-{split}-images-idx3-ubyte", np.zeros((0, 28, 28)))
    write_idx(raw / f"emnist-byclass-{split}-labels-idx1-ubyte", np.zeros((0,)))
    one_sentence(invoke(emnist_args(tmp_path / "data", tmp_path / "e")), 2, f"EMNIST {split} files", "hold 0 images",
                 "N > 0")
    assert not (tmp_path / "e").exists()


@pytest.mark.parametrize("split", ["test", "train"])
def test_a_plugin_dataset_with_an_empty_split_is_refused(tmp_path, split):
    # issue 24 row 11: the check covers every dataset, plug-ins included
    if split == "test":
        cut = "    ds.test_x, ds.test_y = ds.test_x[:0], ds.test_y[:0]\n"
    else:
        cut = "    ds.client_indices = [ix[:0] for ix in ds.client_indices]\n"
    body = "def load(self, config):\n    ds = load_dataset('digits', config.clients, 0.3, config.seed)\n" + cut + \
        "    return ds"
    out = tmp_path / "d"
    one_sentence(invoke(TINY + ["--dataset", dataset(tmp_path, body), "--out", str(out)]), 2,
                 f"dataset 'D' has an empty {split}ing split" if split == "train" else "dataset 'D' has an empty test")
    assert not out.exists()


def test_emnist_images_of_the_wrong_size_are_refused_by_the_loader(tmp_path):
    # issue 24 row 32: 5 x 5 images used to pass the loader and fail in training, after the run directory was made
    make_emnist_root(tmp_path / "data")
    raw = tmp_path / "data" / "EMNIST" / "raw"
    write_idx(raw / "emnist-byclass-train-images-idx3-ubyte", np.zeros((240, 5, 5)))
    one_sentence(invoke(emnist_args(tmp_path / "data", tmp_path / "e")), 2, "(240, 5, 5)", "N x 28 x 28")
    assert not (tmp_path / "e").exists()


def test_a_cifar_batch_of_the_wrong_image_size_is_refused(tmp_path):
    # issue 24 row 32 (CIFAR-10's shape check)
    import pickle

    make_cifar_root(tmp_path / "data")
    batch = {"data": np.zeros((20, 3 * 16 * 16), dtype=np.uint8), "labels": [0] * 20}
    (tmp_path / "data" / "cifar-10-batches-py" / "test_batch").write_bytes(pickle.dumps(batch, protocol=2))
    one_sentence(invoke(["simulate", "--backend", "local", "--rounds", "1", "--quiet", "--dataset", "cifar10",
                         "--clients", "3", "--clients-per-round", "2", "--data-dir", str(tmp_path / "data"),
                         "--out", str(tmp_path / "c")]), 2, "test_batch", "uint8 N x 3072")
    assert not (tmp_path / "c").exists()


# ---- row 17: a FIFO where a file goes is refused before it is opened ------------------------------------------------

def test_a_fifo_among_the_emnist_files_is_refused_not_read(tmp_path):
    # issue 24 row 17
    make_emnist_root(tmp_path / "data")
    fifo = tmp_path / "data" / "EMNIST" / "raw" / "emnist-byclass-train-images-idx3-ubyte"
    fifo.unlink()
    os.mkfifo(fifo)
    one_sentence(invoke(emnist_args(tmp_path / "data", tmp_path / "e")), 2, "is a FIFO", "expected a regular file")


def test_a_fifo_among_the_cifar_batches_is_refused_not_reported_missing(tmp_path):
    # issue 24 row 17: the loader's is_file() used to call it "not found"
    make_cifar_root(tmp_path / "data")
    fifo = tmp_path / "data" / "cifar-10-batches-py" / "data_batch_3"
    fifo.unlink()
    os.mkfifo(fifo)
    one_sentence(invoke(["simulate", "--backend", "local", "--rounds", "1", "--quiet", "--dataset", "cifar10",
                         "--clients", "3", "--clients-per-round", "2", "--data-dir", str(tmp_path / "data"),
                         "--out", str(tmp_path / "c")]), 2, "data_batch_3", "is a FIFO")


def test_a_fifo_as_the_config_file_is_refused(tmp_path):
    # issue 24 row 17
    os.mkfifo(tmp_path / "cfg.yaml")
    one_sentence(invoke(TINY + ["--config", str(tmp_path / "cfg.yaml"), "--out", str(tmp_path / "r")]), 2,
                 "config file", "is a FIFO")


@pytest.mark.parametrize("name", ["log.txt", "config.yaml", "checkpoints/latest.pt"])
def test_a_fifo_in_a_run_directory_is_refused_on_resume(tmp_path, name):
    # issue 24 row 17: the run files read (or appended to) on resume
    out = tmp_path / "r"
    assert invoke(TINY + ["--out", str(out), "--checkpoint-every", "1"]).exit_code == 0
    if name == "config.yaml":  # resume reads it first: keep a copy to point --config at
        (tmp_path / "kept.yaml").write_bytes((out / name).read_bytes())
    (out / name).unlink()
    os.mkfifo(out / name)
    message = one_sentence(invoke(TINY + ["--out", str(out), "--resume"]), 2, name.rpartition("/")[2])
    assert "FIFO" in message


# ---- row 16: YAML aliases are expanded within bounds ----------------------------------------------------------------

def bomb(key):
    lines = [f"{key}:", "  a: &a [1, 1, 1, 1, 1, 1, 1, 1, 1]"]
    for previous, name in zip("abcdefgh", "bcdefghi"):
        lines.append(f"  {name}: &{name} [" + ", ".join([f"*{previous}"] * 9) + "]")
    return "\n".join(lines) + "\n"


def test_a_yaml_alias_bomb_is_refused_in_one_sentence_and_little_memory(tmp_path):
    # issue 24 row 16: 9^9 values from ten lines used to take > 4 GB
    (tmp_path / "bomb.yaml").write_text("rounds: 2\n" + bomb("tier_counts"))
    tracemalloc.start()
    try:
        with pytest.raises(ConfigError, match="aliases expand to more than 100,000 values"):
            load_yaml_config(str(tmp_path / "bomb.yaml"))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 5e6, peak
    one_sentence(invoke(TINY + ["--config", str(tmp_path / "bomb.yaml"), "--out", str(tmp_path / "r")]), 2,
                 "bomb.yaml", "aliases")
    assert not (tmp_path / "r").exists()


def test_a_yaml_alias_bomb_in_a_sweeps_free_text_is_refused(tmp_path):
    # issue 24 row 16: sweep.reproduces is free text, but the bomb is refused before it is read
    (tmp_path / "s.yaml").write_text("rounds: 2\nclients: 6\nclients_per_round: 3\nsweep:\n  algorithms: [hasfl]\n"
                                     "  seeds: [42]\n" + textwrap.indent(bomb("reproduces"), "  "))
    one_sentence(invoke(["sweep", str(tmp_path / "s.yaml"), "--backend", "local", "--out", str(tmp_path / "o")]), 2,
                 "s.yaml", "aliases")
    assert not (tmp_path / "o").exists()


def test_yaml_aliases_that_repeat_a_block_still_work_and_a_recursive_one_is_refused(tmp_path):
    # issue 24 row 16: the bound leaves ordinary anchors alone
    (tmp_path / "ok.yaml").write_text("shared: &s {lr: 0.05}\nother: {<<: *s, rounds: 2}\nlist: [*s, *s]\n")
    assert load_yaml_config(str(tmp_path / "ok.yaml"))["other"] == {"lr": 0.05, "rounds": 2}
    (tmp_path / "loop.yaml").write_text("a: &a [1, *a]\n")
    with pytest.raises(ConfigError, match="alias is used inside the value it names"):
        load_yaml_config(str(tmp_path / "loop.yaml"))


def test_a_config_nested_too_deeply_is_one_sentence(tmp_path):
    # issue 24 row 16 (a cousin: the YAML composer recurses once a level)
    (tmp_path / "deep.yaml").write_text("a: " + "[" * 50000 + "]" * 50000 + "\n")
    with pytest.raises(ConfigError, match="nested too deeply"):
        load_yaml_config(str(tmp_path / "deep.yaml"))


# ---- row 18: bench aggregate estimates its memory --------------------------------------------------------------------

def test_bench_aggregate_refuses_a_client_count_that_cannot_fit(tmp_path):
    # issue 24 row 18: 100,000 clients used to head for ~1.3 TB; refused at once, before anything is allocated
    tracemalloc.start()
    try:
        result = invoke(["bench", "aggregate", "--clients", "10,100000000", "--repeats", "1"])
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    one_sentence(result, 2, "clients is 100000000", "bytes a client", "expected at most about")
    assert peak < 50e6, peak


def test_bench_aggregate_memory_estimate_follows_simulates_rule(monkeypatch):
    # issue 24 row 18: the estimate is simulate's check_client_memory with a case's bytes per client
    import hasfl_ray.data.memory as memory
    from hasfl_ray.bench.aggregate import bytes_per_client, check_case_memory

    per_client = bytes_per_client("emnist")
    assert 4e6 < per_client < 40e6  # ~4.6 MB of packed float32 updates a client, times the working copies
    monkeypatch.setattr(memory, "physical_memory", lambda: 100 * per_client)
    check_case_memory(["emnist"], [10, 100])
    with pytest.raises(ConfigError, match="clients is 101"):
        check_case_memory(["emnist", "shakespeare"], [101])


def test_plugin_error_is_a_run_error():
    # issue 24 rows 10/25/27: every plug-in failure is exit status 1 at the CLI (RunError), one sentence
    from hasfl_ray.errors import RunError

    assert issubclass(PluginError, RunError)
