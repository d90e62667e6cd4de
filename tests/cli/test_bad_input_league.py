"""The league's methods refuse a run their model cannot give them in one sentence with exit status 2, before the
run directory is made (``Algorithm.check_model``, called while the run is prepared): a FIARSE or FedGMR width (of
the ladder, or an evaluation width) whose model size keeps none of the scored parameters, and FLuID on a model
without channel groups (an LSTM). Before, each was found in the first round, after config.yaml, log.txt and
metrics.jsonl had been written."""

import textwrap

import pytest

from sentences import invoke, refused

BASE = ["--rounds", 1, "--clients", 4, "--clients-per-round", 2, "--backend", "local", "--quiet"]


@pytest.mark.parametrize("algorithm, args, words", [
    ("fiarse", ["--widths", "0.001,1"], ["width 0.001 gives fiarse model size 1e-06 (fiarse_size square)",
                                         "keeps none of the 53002 scored parameters", "size >= 1.89e-05"]),
    ("fiarse", ["--eval-widths", "0.001"], ["width 0.001 gives fiarse model size 1e-06"]),
    ("fiarse", ["--widths", "0.00001,1", "--algo-opt", "fiarse_size=width"],
     ["width 1e-05 gives fiarse model size 1e-05 (fiarse_size width)"]),
    ("fiarse", ["--widths", "0.01,1", "--algo-opt", "fiarse_scope=stage"],
     ["model size 0.0001", "none of the 1290 scored parameters of stage fc2"]),
    ("fedgmr", ["--widths", "0.001,1"], ["width 0.001 gives fedgmr model size 1e-06 (fedgmr_size square)"]),
])
def test_a_mask_methods_width_that_keeps_nothing_is_refused_before_the_run_directory(tmp_path, algorithm, args,
                                                                                    words):
    result = invoke("simulate", "--algorithm", algorithm, *BASE, "--out", tmp_path / "run", *args)
    refused(result, *words)
    assert not (tmp_path / "run").exists()


def test_the_smallest_width_that_keeps_one_parameter_still_runs(tmp_path):
    """The boundary: int(53002 x 0.0044^2) = 1 scored parameter is a size the threshold rule can take."""
    result = invoke("simulate", "--algorithm", "fiarse", *BASE, "--widths", "0.0044,1", "--out", tmp_path / "run")
    assert result.exit_code == 0, result.output
    assert (tmp_path / "run" / "summary.json").exists()


def test_fluid_on_an_lstm_is_refused_before_the_run_directory(tmp_path):
    plugin = tmp_path / "text.py"
    plugin.write_text(textwrap.dedent("""
        import torch
        from hasfl_ray import Dataset
        from hasfl_ray.data.base import TextFederatedDataset

        class Text(Dataset):
            model = "bad-input-lstm"
            model_config = dict(kind="lstm", vocab_size=20, embed_dim=8, hidden=16, layers=1, seq_len=12)
            defaults = dict(rounds=1, local_epochs=1, lr=0.5, clip_norm=5.0, batch_size=8)

            def load(self, config):
                stream = torch.randint(0, 20, (config.clients * 24 + 13,), dtype=torch.uint8,
                                       generator=torch.Generator().manual_seed(0))
                return TextFederatedDataset("text", self.model, 20, stream,
                                            list(torch.arange(config.clients * 24).split(24)), torch.arange(40),
                                            [f"c{i}" for i in range(config.clients)], 12)
    """))
    result = invoke("simulate", "--algorithm", "fluid", "--dataset", f"{plugin}:Text", *BASE,
                    "--out", tmp_path / "run")
    refused(result, "algorithm fluid needs a model of channel groups", "model 'bad-input-lstm' is not one")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("config", ["lr_decay: 0.5\n", "lr_decay: 0.5\nalgorithm_options:\n  depthfl_lr_decay: 0.9\n"])
def test_depthfl_refuses_an_lr_decay_it_would_replace(tmp_path, config):
    """DepthFL's learning rate decays by depthfl_lr_decay (the run's lr_decay is set from it): an lr_decay given
    beside it, in a YAML config or a flag, was replaced without a word; now it is refused, naming the option to use."""
    (tmp_path / "c.yaml").write_text("algorithm: depthfl\n" + config)
    result = invoke("simulate", "--config", tmp_path / "c.yaml", *BASE, "--out", tmp_path / "run")
    refused(result, "lr_decay is 0.5 but algorithm depthfl decays the learning rate by depthfl_lr_decay",
            "expected --algo-opt depthfl_lr_decay=0.5 in its place")
    assert not (tmp_path / "run").exists()


def test_depthfl_takes_an_lr_decay_equal_to_its_own(tmp_path):
    result = invoke("simulate", "--algorithm", "depthfl", *BASE, "--lr-decay", 0.9, "--algo-opt",
                    "depthfl_lr_decay=0.9", "--out", tmp_path / "run")
    assert result.exit_code == 0, result.output
    assert "lr_decay: 0.9\n" in (tmp_path / "run" / "config.yaml").read_text()


@pytest.mark.parametrize("algorithm", ["fiarse", "fedgmr"])
@pytest.mark.parametrize("args, words", [
    (["--estimator", "common-core"], "trains parameter masks and estimator is 'common-core'; expected estimator masked"),
    (["--classifier-aggregation", "label_split", "--partition", "classes:5"],
     "trains parameter masks and classifier_aggregation is 'label_split'; expected classifier_aggregation all"),
    (["--sub-model", "depth"], "trains parameter masks and sub_model is 'depth'; expected sub_model width"),
])
def test_a_mask_method_refuses_what_the_server_cannot_mix_with_masks(tmp_path, algorithm, args, words):
    """FIARSE and FedGMR with a label split or the common-core estimator ended in a ValueError traceback in the
    first round's aggregation (exit 1), with a depth in a sentence after the run directory was written; each is
    now refused up front, as FLuID's index sets are (config.sparse_mix.check_sparse_config, one rule for both)."""
    result = invoke("simulate", "--algorithm", algorithm, *BASE, "--out", tmp_path / "run", *args)
    refused(result, f"algorithm {algorithm} {words}")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("backend", [["--backend", "local"], ["--backend", "ray", "--actors", 2,
                                                               "--server-placement", "actor"]], ids=["local", "ray"])
def test_a_plugins_masks_beside_the_common_core_estimator_are_one_sentence(tmp_path, backend):
    """A plug-in's masks are known only once it hands them out: the refusal (at dispatch, before the client trains;
    the server's own check behind it) is one sentence, exit 2, not a ValueError traceback (nor, from Ray's server
    actor, Ray's report of it)."""
    if backend[1] == "ray":
        pytest.importorskip("ray", reason="the server actor needs Ray")
    args = [a for a in BASE if a not in ("--backend", "local")]
    result = invoke("simulate", "--algorithm", "examples/mask_policy.py:RandomMasks", *args, *backend,
                    "--estimator", "common-core", "--out", tmp_path / "run")
    refused(result, "handed client 0 masks and estimator is 'common-core'", "expected estimator masked")


@pytest.mark.parametrize("algorithm", ["depthfl", "scalefl"])
def test_a_depth_method_on_a_model_without_exits_names_every_model_with_them(tmp_path, algorithm):
    """The sentence listed the image CNNs with exits as digits, emnist and cifar10; CIFAR-100's CNN has them too
    (DepthFL and ScaleFL run on it)."""
    result = invoke("simulate", "--algorithm", algorithm, "--dataset", "synthetic", *BASE, "--out", tmp_path / "run")
    refused(result, "model 'synthetic' has no exits", "(digits, emnist, cifar10, cifar100)")
    assert not (tmp_path / "run").exists()
