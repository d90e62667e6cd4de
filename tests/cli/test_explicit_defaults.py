"""A value the user gives is never replaced by an algorithm's or a dataset's default, also when it equals the schema's
default (issue 44): ``--algorithm depthfl --lr-decay 0.995`` ran at DepthFL's 0.998, and ``--sub-model width`` with
depthfl or scalefl trained depth sub-models, because the algorithm's value was applied whenever the config held the
schema's default. Now ``lr_decay`` and ``sub_model`` are None when not given (``RunConfig.resolved`` fills 0.995 and
width where the algorithm sets nothing), so a given value is told from the default on the command line, in a config
file, through the Python API and in a sweep cell; config.yaml holds the resolved value, which --resume reads back."""

import textwrap

import pytest

from hasfl_ray.api import make_config
from hasfl_ray.config import RunConfig
from hasfl_ray.engine.checkpoint import config_differences
from hasfl_ray.errors import ConfigError

from sentences import invoke, refused

BASE = ["--rounds", 1, "--clients", 4, "--clients-per-round", 2, "--backend", "local", "--quiet"]
LR_DECAY = "lr_decay is 0.995 but algorithm depthfl decays the learning rate by depthfl_lr_decay (0.998)"


def resolved(**values):
    return RunConfig.from_dict({"backend": "local", **values}).resolved()


@pytest.mark.parametrize("how", ["flag", "config file"])
def test_an_explicit_lr_decay_equal_to_the_default_is_not_replaced_by_depthfls(tmp_path, how):
    if how == "flag":
        args = ["--algorithm", "depthfl", "--lr-decay", 0.995]
    else:
        (tmp_path / "c.yaml").write_text("algorithm: depthfl\nlr_decay: 0.995\n")
        args = ["--config", tmp_path / "c.yaml"]
    result = invoke("simulate", *args, *BASE, "--out", tmp_path / "run")
    refused(result, LR_DECAY, "expected --algo-opt depthfl_lr_decay=0.995 in its place")
    assert not (tmp_path / "run").exists()


def test_the_python_api_tells_a_given_lr_decay_from_the_default():
    with pytest.raises(ConfigError, match="lr_decay is 0.995 but algorithm depthfl"):
        make_config(algorithm="depthfl", lr_decay=0.995, backend="local").resolved()
    assert make_config(algorithm="depthfl", backend="local").resolved().lr_decay == 0.998
    given = make_config(algorithm="depthfl", lr_decay=0.99, backend="local",
                                  algorithm_options={"depthfl_lr_decay": 0.99}).resolved()
    assert given.lr_decay == 0.99


@pytest.mark.parametrize("algorithm, sets", [("depthfl", "depth"), ("scalefl", "width_depth")])
def test_an_explicit_width_sub_model_is_refused_not_replaced(tmp_path, algorithm, sets):
    result = invoke("simulate", "--algorithm", algorithm, "--sub-model", "width", *BASE, "--out", tmp_path / "run")
    refused(result, f"sub_model is 'width' but algorithm {algorithm}", f"expected sub_model {sets} (or left unset)")
    assert not (tmp_path / "run").exists()
    with pytest.raises(ConfigError, match=f"sub_model is 'width' but algorithm {algorithm}"):
        resolved(algorithm=algorithm, sub_model="width")
    assert resolved(algorithm=algorithm).sub_model == sets


def test_unset_keys_resolve_to_the_same_values_as_before():
    """What every run that gives neither key keeps (config.yaml, the default folder's hash, the params_sha256)."""
    for algorithm in ("hasfl", "fedavg", "scaffold", "fiarse"):
        config = resolved(algorithm=algorithm)
        assert (config.lr_decay, config.sub_model) == (0.995, "width")
        assert (resolved(algorithm=algorithm, lr_decay=0.995, sub_model="width").result_dict()
                == config.result_dict())
    config = resolved(algorithm="depthfl")
    assert (config.lr_decay, config.sub_model, config.momentum) == (0.998, "depth", 0.0)
    assert config.resolved() == config  # resolving again (the Engine does) keeps it


def test_depths_with_an_implied_sub_model_and_label_split_are_checked_before_resolution():
    """A depth sub-model the algorithm sets is what the construction checks see (``effective_sub_model``)."""
    assert RunConfig(algorithm="depthfl", depths=[1, 2, 3, 4]).depths == [1, 2, 3, 4]
    with pytest.raises(ConfigError, match="depths is \\[1, 2, 3, 4\\] but sub_model is 'width'"):
        RunConfig(algorithm="hasfl", depths=[1, 2, 3, 4])
    with pytest.raises(ConfigError, match="classifier_aggregation is 'label_split' but sub_model is 'depth' "
                                          "\\(set by algorithm depthfl\\)"):
        RunConfig(algorithm="depthfl", classifier_aggregation="label_split", partition="classes:5")


def test_a_depthfl_run_writes_the_resolved_values_and_resumes_with_them(tmp_path):
    out = tmp_path / "run"
    result = invoke("simulate", "--algorithm", "depthfl", *BASE, "--out", out)
    assert result.exit_code == 0, result.output
    text = (out / "config.yaml").read_text()
    assert "lr_decay: 0.998\n" in text and "sub_model: depth\n" in text
    result = invoke("simulate", "--out", out, "--resume", "--rounds", 2, "--force", "--quiet")
    assert result.exit_code == 0, result.output
    assert len((out / "metrics.jsonl").read_text().splitlines()) == 2


def test_a_stored_config_without_the_keys_reads_as_the_defaults_of_then():
    """A run written before sub_model existed (or any lacking lr_decay) trained width slices at 0.995: --resume
    finds no difference (None is "not given" now, never a value a stored run had)."""
    config = resolved(algorithm="hasfl")
    stored = {k: v for k, v in config.to_dict().items() if k not in ("sub_model", "lr_decay")}
    assert config_differences(stored, config) == []
    assert config_differences({**stored, "lr_decay": 0.99}, config) == ["lr_decay 0.99 -> 0.995"]


def test_a_sweep_cell_giving_the_default_lr_decay_is_not_replaced(tmp_path):
    (tmp_path / "s.yaml").write_text(textwrap.dedent("""
        clients: 4
        clients_per_round: 2
        rounds: 1
        backend: local
        lr_decay: 0.995
        sweep:
          algorithms: [hasfl, depthfl]
    """))
    result = invoke("sweep", tmp_path / "s.yaml", "--out", tmp_path / "runs", "--backend", "local")
    assert result.exit_code == 1, result.output  # a sweep's refused cell (cli/sweep.py)
    assert f"digits-depthfl-seed42: failed: {LR_DECAY}" in result.output
    assert "1 of 2 cells was refused as it started, for bad input" in result.output
    assert not (tmp_path / "runs" / "digits-depthfl-seed42" / "config.yaml").exists()
    assert "lr_decay: 0.995\n" in (tmp_path / "runs" / "digits-hasfl-seed42" / "config.yaml").read_text()


def test_a_dataset_default_for_a_key_with_its_own_default_is_refused_and_others_apply(tmp_path):
    """A dataset plug-in's ``defaults`` entry for a key that is never unset (weight_decay) was never applied and
    said nothing; lr_decay (unset now when not given) takes the dataset's default, under the algorithm's own."""
    plugin = tmp_path / "blobs.py"
    plugin.write_text(textwrap.dedent("""
        from hasfl_ray import Dataset

        class Blobs(Dataset):
            model = "digits"
            defaults = dict(rounds=1, local_epochs=1, lr=0.05, clip_norm=10.0, batch_size=8, lr_decay=0.9)

            def load(self, config):  # never reached: the config is only resolved
                raise NotImplementedError

        class Decayed(Blobs):
            defaults = dict(Blobs.defaults, weight_decay=0.0)
    """))
    with pytest.raises(ConfigError, match="dataset 'Decayed' has default weight_decay=0.0 but weight_decay has its "
                                          "own default, never replaced"):
        resolved(dataset=f"{plugin}:Decayed")
    assert resolved(dataset=f"{plugin}:Blobs").lr_decay == 0.9
    assert resolved(dataset=f"{plugin}:Blobs", lr_decay=0.995).lr_decay == 0.995
    assert resolved(dataset=f"{plugin}:Blobs", algorithm="depthfl").lr_decay == 0.998


@pytest.mark.parametrize("algorithm", ["depthfl", "scalefl", "fiarse"])
def test_an_explicit_samples_weighting_is_refused_where_the_method_always_counts(tmp_path, algorithm):
    """DepthFL, ScaleFL and FIARSE weigh each client 1 whatever ``aggregation_weights`` says: the schema's default
    given (samples) was ignored unsaid. config.yaml keeps samples for the runs that give nothing (their hash), so
    only a value the user gives is checked (``fixed_config``), never a stored run's."""
    result = invoke("simulate", "--algorithm", algorithm, "--aggregation-weights", "samples", *BASE,
                    "--out", tmp_path / "run")
    refused(result, f"aggregation_weights is 'samples' but algorithm {algorithm} always runs with "
                    "aggregation_weights count", "expected count or aggregation_weights left unset")
    assert not (tmp_path / "run").exists()
    with pytest.raises(ConfigError, match=f"algorithm {algorithm} always runs with aggregation_weights count"):
        make_config(algorithm=algorithm, aggregation_weights="samples", backend="local")
    assert make_config(algorithm=algorithm, aggregation_weights="count", backend="local").aggregation_weights == \
        "count"


def test_a_stored_config_holding_the_default_weighting_is_no_value_given(tmp_path):
    """A DepthFL run's config.yaml holds ``aggregation_weights: samples`` (the default it records): given back as a
    config file, or resumed, it is the run's own config, not the user's key."""
    out = tmp_path / "run"
    assert invoke("simulate", "--algorithm", "depthfl", *BASE, "--out", out).exit_code == 0
    assert "aggregation_weights: samples\n" in (out / "config.yaml").read_text()
    result = invoke("simulate", "--config", out / "config.yaml", "--out", tmp_path / "again", "--quiet")
    assert result.exit_code == 0, result.output
    assert make_config(algorithm="fedgmr", aggregation_weights="samples", backend="local").algorithm == "fedgmr"


@pytest.mark.parametrize("dataset", ["synthetic", "shakespeare"])
def test_an_explicit_default_partition_on_a_dataset_with_its_own_clients_is_refused(tmp_path, dataset):
    """``--partition iid`` was refused there but ``--partition dirichlet`` (the default, given) ran on the dataset's
    own clients without a word; a stored config (which holds dirichlet) is no value given."""
    result = invoke("simulate", "--dataset", dataset, "--partition", "dirichlet", *BASE, "--out", tmp_path / "run")
    refused(result, f"partition is 'dirichlet' but dataset '{dataset}' has its own clients",
            "expected partition left unset")
    assert not (tmp_path / "run").exists()
    with pytest.raises(ConfigError, match="partition is 'dirichlet' but dataset"):
        make_config(dataset=dataset, partition="dirichlet", backend="local")
    stored = resolved(dataset=dataset).to_dict()
    assert make_config(stored).partition == "dirichlet"


def test_heterofls_count_option_beside_an_explicit_samples_weighting_is_refused(tmp_path):
    result = invoke("simulate", "--algorithm", "heterofl", "--heterofl-weighting", "count", "--aggregation-weights",
                    "samples", *BASE, "--out", tmp_path / "run")
    refused(result, "aggregation_weights is 'samples' but heterofl_weighting is 'count'")
    assert not (tmp_path / "run").exists()
