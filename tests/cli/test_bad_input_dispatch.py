"""Bad input found only once a run has begun, before its first round is recorded (issue 44): a plug-in policy
whose first dispatch hands out channel sets, masks or a depth the checks refuse. The sentence and exit status 2 were
right, but the run directory kept config.yaml, log.txt, metrics.csv, an empty metrics.jsonl and events/: a
half-written run. Now such a start is undone as one refused before it (``Engine.run``, ``remove_written``): a folder
this invocation made is gone, a folder it found empty is empty again; a resumed run, or one with a recorded round,
is never touched. On the local backend, in async mode, on Ray and in a sweep cell."""

import importlib.util
import os
import textwrap

import pytest

from sentences import invoke, refused


TINY = ["--rounds", 2, "--clients", 6, "--clients-per-round", 3, "--quiet", "--dataset", "digits"]
CHANNELS = "group 0 holds 1 of 32 channels at width"

#: Plug-ins whose every dispatch (or, ``Late``, every dispatch after round 0) hands out what the checks refuse.
PLUGINS = textwrap.dedent("""
    import torch
    from hasfl_ray import Algorithm


    class Channels(Algorithm):
        def channel_sets(self, round, client, width):
            return [[0]] * 3


    class Masks(Algorithm):
        def parameter_masks(self, round, client, width):
            return {"no.such.parameter": torch.ones(2, dtype=torch.bool)}


    class Depth(Algorithm):
        def sub_model(self, round, client, width):
            return (width, 99)


    class Late(Algorithm):
        def channel_sets(self, round, client, width):
            return None if round == 0 else [[0]] * 3
""")


@pytest.fixture
def plugin(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "policy.py").write_text(PLUGINS)
    return lambda name: f"{tmp_path / 'policy.py'}:{name}"


@pytest.mark.parametrize("name, args, words", [
    ("Channels", ["--backend", "local"], [CHANNELS]),
    ("Channels", ["--backend", "local", "--mode", "async", "--devices", "lognormal"], [CHANNELS]),
    ("Masks", ["--backend", "local"], ["algorithm 'Masks' returned masks for client"]),
    ("Depth", ["--backend", "local", "--sub-model", "depth"], ["algorithm 'Depth' returned", "from sub_model()"]),
])
def test_a_refusal_at_the_first_dispatch_leaves_no_run_directory(tmp_path, plugin, name, args, words):
    out = tmp_path / "runs" / "new"
    result = invoke("simulate", *TINY, "--algorithm", plugin(name), *args, "--out", out)
    refused(result, *words)
    assert not (tmp_path / "runs").exists()  # the folder and the parent this invocation made


def test_a_folder_found_empty_is_left_empty(tmp_path, plugin):
    out = tmp_path / "empty"
    out.mkdir()
    refused(invoke("simulate", *TINY, "--backend", "local", "--algorithm", plugin("Channels"), "--out", out),
            CHANNELS)
    assert out.is_dir() and os.listdir(out) == []


def test_the_default_run_folder_and_its_latest_link_go_too(tmp_path, plugin):
    refused(invoke("simulate", *TINY, "--backend", "local", "--algorithm", plugin("Channels")), CHANNELS)
    runs = tmp_path / "runs"
    assert not runs.exists() or os.listdir(runs) == [], os.listdir(runs)


def test_a_run_with_a_recorded_round_is_kept(tmp_path, plugin):
    """Round 0 ran and was recorded; the refusal at round 1 leaves the run as it is, its line included."""
    out = tmp_path / "run"
    refused(invoke("simulate", *TINY, "--backend", "local", "--algorithm", plugin("Late"), "--out", out), CHANNELS)
    assert (out / "config.yaml").exists()
    assert len((out / "metrics.jsonl").read_text().splitlines()) == 1


def test_a_resumed_run_is_never_removed(tmp_path, plugin):
    """A finished run of one round resumed for a second under a policy refused from round 1: the directory stays."""
    out = tmp_path / "run"
    result = invoke("simulate", *TINY[2:], "--rounds", 1, "--backend", "local", "--algorithm", plugin("Late"),
                    "--out", out)
    assert result.exit_code == 0, result.output
    before = sorted(os.listdir(out))
    metrics = (out / "metrics.jsonl").read_text()
    refused(invoke("simulate", "--out", out, "--resume", "--rounds", 2, "--force", "--quiet"), CHANNELS)
    assert sorted(os.listdir(out)) == before and (out / "metrics.jsonl").read_text() == metrics


def test_a_refused_sweep_cell_leaves_no_cell_folder(tmp_path, plugin):
    (tmp_path / "s.yaml").write_text(f"clients: 6\nclients_per_round: 3\nrounds: 1\nbackend: local\n"
                                     f"sweep:\n  algorithms: [hasfl, '{plugin('Channels')}']\n")
    result = invoke("sweep", tmp_path / "s.yaml", "--out", tmp_path / "runs", "--backend", "local")
    assert result.exit_code == 1 and CHANNELS in result.output, result.output  # a sweep's refused cell
    cells = sorted(os.listdir(tmp_path / "runs"))
    assert cells == ["digits-hasfl-seed42", "sweep.json"], cells


@pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="needs Ray (the Ray backend's dispatch)")
def test_a_refusal_at_the_first_dispatch_on_ray_leaves_no_run_directory(tmp_path, plugin):
    out = tmp_path / "run"
    result = invoke("simulate", *TINY, "--backend", "ray", "--actors", 1, "--algorithm", plugin("Channels"),
                    "--out", out)
    refused(result, CHANNELS)
    assert not out.exists()


def test_the_undo_removes_only_what_the_start_wrote_and_never_saved_state(tmp_path):
    """``undo_refused_start`` acts only while a ConfigError is raised, and keeps a start that saved a checkpoint (an
    asynchronous run checkpoints server updates before its first line) and the entries found before the start."""
    from types import SimpleNamespace

    from hasfl_ray.engine.refused_start import undo_refused_start
    from hasfl_ray.errors import ConfigError, RunError

    def undo(found, error, history=()):
        engine = SimpleNamespace(rundir=SimpleNamespace(path=str(tmp_path)), history=list(history))
        try:
            raise error
        except Exception:
            return undo_refused_start(engine, found)

    (tmp_path / "mine.txt").write_text("kept")
    (tmp_path / "config.yaml").write_text("written")
    assert not undo({"mine.txt"}, RunError("a trainer failed")) and (tmp_path / "config.yaml").exists()
    assert not undo({"mine.txt"}, ConfigError("bad"), history=[{"round": 0}])
    assert not undo(None, ConfigError("bad")) and (tmp_path / "config.yaml").exists()
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "latest.pt").write_bytes(b"state")
    assert not undo({"mine.txt"}, ConfigError("bad")) and (tmp_path / "config.yaml").exists()
    (tmp_path / "checkpoints" / "latest.pt").unlink()
    assert undo({"mine.txt"}, ConfigError("bad"))
    assert sorted(os.listdir(tmp_path)) == ["mine.txt"]


@pytest.mark.parametrize("args", [["--backend", "local"], ["--backend", "local", "--mode", "async", "--devices",
                                                             "lognormal"]])
def test_a_league_methods_refusal_at_dispatch_leaves_no_run_directory(tmp_path, monkeypatch, args):
    """FIARSE's threshold refuses a model size that keeps no parameter (``league/fiarse.py::threshold``); the
    prepare-time check (``FIARSE.check_model``) normally finds it first, so it is switched off here to reach the
    refusal where a league method meets it at dispatch, in rounds and in async mode."""
    from hasfl_ray.algorithms.fiarse import FIARSE

    monkeypatch.setattr(FIARSE, "check_model", lambda self, widths: None)
    out = tmp_path / "run"
    result = invoke("simulate", *TINY, "--algorithm", "fiarse", "--widths", "0.001,1", *args, "--out", out)
    refused(result, "keeps int(")
    assert not out.exists()


def test_the_python_api_leaves_no_run_directory_either(tmp_path, plugin):
    import hasfl_ray
    from hasfl_ray.errors import PluginInputError

    with pytest.raises(PluginInputError, match=CHANNELS):
        hasfl_ray.simulate(algorithm=plugin("Channels"), rounds=2, clients=6, clients_per_round=3, backend="local",
                           out_dir=str(tmp_path / "api"))
    assert not (tmp_path / "api").exists()


def test_a_dataset_plugins_data_error_at_the_first_evaluation_leaves_no_run_directory(tmp_path, monkeypatch):
    """A dataset plug-in that finds its test file corrupt only when the first evaluation reads it (a DataError:
    bad input, exit 2, its own sentence) left the run directory of a round it never recorded."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "lazy.py").write_text(textwrap.dedent("""
        from hasfl_ray import Dataset
        from hasfl_ray.data import load_dataset
        from hasfl_ray.errors import DataError


        class Lazy(Dataset):
            model = "digits"
            label_partitions = True
            defaults = dict(rounds=2, local_epochs=1, lr=0.05, clip_norm=10.0, batch_size=32)

            def load(self, config):
                data = load_dataset("digits", config.clients, config.alpha, config.seed)

                def test_batches(batch_size):
                    raise DataError("test file lazy.bin is truncated at byte 12; expected 1,797 records")
                    yield

                data.test_batches = test_batches
                return data
    """))
    out = tmp_path / "run"
    result = invoke("simulate", *TINY[:6], "--quiet", "--backend", "local", "--dataset", f"{tmp_path / 'lazy.py'}:Lazy",
                    "--out", out)
    refused(result, "test file lazy.bin is truncated at byte 12")
    assert not out.exists()


#: h71: what sub_model() returned was put in the sentence with repr: a tensor's ran over many lines, and a value
#: whose __repr__ raises ended in that traceback (exit 1, config.yaml, log.txt and metrics left).
ODD_DEPTHS = textwrap.dedent("""
    import torch
    from hasfl_ray import Algorithm


    class NoRepr:
        def __repr__(self):
            raise RuntimeError("no repr")


    class TensorDepth(Algorithm):
        def sub_model(self, round, client, width):
            return (torch.rand(50, 50), 1)


    class UnshownDepth(Algorithm):
        def sub_model(self, round, client, width):
            return NoRepr()
""")


@pytest.mark.parametrize("name, shown", [("TensorDepth", "returned (tensor([["),
                                         ("UnshownDepth", "returned a NoRepr object")])
def test_an_odd_sub_model_value_is_shown_on_one_line(tmp_path, monkeypatch, name, shown):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "odd.py").write_text(ODD_DEPTHS)
    out = tmp_path / "runs" / "odd"
    result = invoke("simulate", *TINY, "--backend", "local", "--sub-model", "depth", "--algorithm",
                    f"{tmp_path / 'odd.py'}:{name}", "--out", out)
    refused(result, f"algorithm '{name}' {shown}", "from sub_model(); expected (width in (0, 1], depth 1 to 2)")
    assert not (tmp_path / "runs").exists()
