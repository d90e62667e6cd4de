"""config_version 2 (the algorithm's options in algorithm_options) and the migration of version-1 run directories.

Bit-identity holds on one machine type and torch build, not across them (docs/design.md, Determinism): a resume is
compared with an uninterrupted run made on the machine the test runs on. :func:`write_version_1_run` writes a
version-1 run directory on the spot (today's code stopped by ``--fault-inject trainer-error@2`` after checkpointing
rounds 0 and 1 of 4, its config.yaml and its checkpoint's config then rewritten in the version-1 layout: no
config_version, every built-in's options as flat keys).

tests/engine/data/v1-runs/ holds two real version-1 run directories, written by hasfl-ray at commit 9338156 the same
way (digits, 6 clients, 3 a round, seed 5):

- fedprox: ``mu 0.3``;
- hasfl: ``p_min 0.3, gamma 0.3, beta 0.8, t_norm 2, warmup 1, t_adapt 1``.

They test the reading of old files, and their checkpoints' weights come from the machine that wrote them: the
params_sha256 recorded for them (:data:`V1_UNINTERRUPTED`) is checked only on the machine type recorded in
``v1-runs/machine.json``.
"""

import json
import shutil
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

import hasfl_ray
from hasfl_ray.cli.main import main
from hasfl_ray.engine.checkpoint import load_checkpoint, save_checkpoint
from hasfl_ray.config import CONFIG_VERSION, LEGACY_OPTION_KEYS, RunConfig, migrate_config
from hasfl_ray.errors import ConfigError, TrainerError
from tests.engine.recorded_machine import other_machine

V1_RUNS = Path(__file__).parent / "data" / "v1-runs"
COMMON = dict(rounds=4, clients=6, clients_per_round=3, seed=5, backend="local")
#: How the version-1 runs were stopped: a checkpoint after every round, then a trainer error in round 2.
STOPPED = dict(checkpoint_every=1, fault_inject="trainer-error@2")
CONFIGS = {"fedprox": dict(algorithm="fedprox", mu=0.3),
           "hasfl": dict(algorithm="hasfl", p_min=0.3, gamma=0.3, beta=0.8, t_norm=2, warmup=1, t_adapt=1)}
#: params_sha256 of the uninterrupted runs, as commit 9338156 computed them on the machine of machine.json.
V1_UNINTERRUPTED = {"fedprox": "54328afd0de73a6a901e9c8f5d4fafb6f236dfb9ffd8b7a4bf4b853829892da8",
                    "hasfl": "1366bcd1825cea30016c55a9a08760e08ae2caba9df7d8915afa1545beb897ac"}
#: What a version-1 config.yaml held for the built-ins' options its algorithm does not own (their defaults then).
V1_OPTION_DEFAULTS = {"coverage": True, "p_min": 0.4, "gamma": 0.25, "beta": 0.9, "t_norm": 20, "epsilon": 1e-8,
                      "mu": 1.0, "budget": None, "budget_from": None, "heterofl_weighting": "samples",
                      "fjord_distill_weight": 1.0, "scaffold_global_lr": 1.0, "rolex_step": 1}


def v1_config(name):
    with open(V1_RUNS / name / "config.yaml", encoding="utf-8") as handle:
        return yaml.safe_load(handle)


#: The keys of a version-1 config.yaml, in the order commit 9338156 wrote them.
V1_LAYOUT = list(v1_config("hasfl"))


def version_1(values):
    """A config of today (:meth:`RunConfig.to_dict`) in the version-1 layout: no config_version, the algorithm's
    options and every other built-in's (at :data:`V1_OPTION_DEFAULTS`) as flat keys, algorithm_options empty."""
    flat = {**V1_OPTION_DEFAULTS, **values["algorithm_options"], **values}
    return {key: {} if key == "algorithm_options" else flat[key] for key in V1_LAYOUT}


def write_version_1_run(path, values):
    """A version-1 run directory of ``COMMON`` + ``values`` at ``path``, written on this machine: rounds 0 and 1
    checkpointed, then a trainer error in round 2; config.yaml and the checkpoint's config in the version-1 layout."""
    with pytest.raises(TrainerError, match="trainer-error@2"):
        hasfl_ray.simulate({**COMMON, **values, **STOPPED}, out_dir=str(path))
    text = (path / "config.yaml").read_text(encoding="utf-8")
    execution = text[text.index("# execution"):]  # the comments a run writes after its keys, as version 1 did
    (path / "config.yaml").write_text(yaml.safe_dump(version_1(yaml.safe_load(text)), sort_keys=False) + execution,
                                      encoding="utf-8")
    checkpoint = load_checkpoint(str(path))
    assert checkpoint.round == 2
    checkpoint.config = version_1(checkpoint.config)
    save_checkpoint(str(path), checkpoint)
    return path


def test_the_fixtures_are_version_1_and_the_writer_gives_their_layout(tmp_path):
    for name, values in CONFIGS.items():
        stored = v1_config(name)
        assert "config_version" not in stored and set(LEGACY_OPTION_KEYS) <= set(stored)
        today = RunConfig.from_dict({**COMMON, **values, **STOPPED}).resolved().to_dict()
        written = version_1(today)
        assert list(written) == list(stored) and written == stored
        assert load_checkpoint(str(V1_RUNS / name)).config == stored  # the checkpoint holds version 1 too
    run = write_version_1_run(tmp_path / "fedprox", CONFIGS["fedprox"])
    assert yaml.safe_load((run / "config.yaml").read_text()) == v1_config("fedprox")
    assert load_checkpoint(str(run)).config == v1_config("fedprox")


def test_migration_keeps_the_algorithms_options_and_drops_the_others():
    fedprox = migrate_config(v1_config("fedprox"))
    assert fedprox["algorithm_options"] == {"mu": 0.3}
    assert not set(LEGACY_OPTION_KEYS) & set(fedprox)
    hasfl = migrate_config(v1_config("hasfl"))
    assert hasfl["algorithm_options"] == {"coverage": True, "p_min": 0.3, "gamma": 0.3, "beta": 0.8, "t_norm": 2,
                                          "epsilon": 1e-8}
    assert hasfl["warmup"] == 1 and hasfl["t_adapt"] == 1  # the schedule stays the protocol's
    # migrated, it builds the same resolved config as the options given today
    for name, values in CONFIGS.items():
        stored = RunConfig.from_dict(migrate_config(v1_config(name))).resolved().result_dict()
        today = RunConfig.from_dict({**COMMON, **values}).resolved().result_dict()
        assert {k: v for k, v in stored.items() if k != "fault_inject"} == today


def test_a_plugin_runs_options_were_always_in_algorithm_options():
    stored = {**v1_config("fedprox"), "algorithm": "examples/loss_policy.py:LossPolicy",
              "algorithm_options": {"gain": 0.5}}
    assert migrate_config(stored)["algorithm_options"] == {"gain": 0.5}


def resume(run):
    """``simulate --resume`` of ``run``: its summary, after checking it now holds a version-2 config.yaml."""
    result = CliRunner().invoke(main, ["simulate", "--out", str(run), "--resume", "--quiet"])
    assert result.exit_code == 0, result.output
    resumed = yaml.safe_load((run / "config.yaml").read_text())
    assert resumed["config_version"] == CONFIG_VERSION and not set(LEGACY_OPTION_KEYS) & set(resumed)
    return json.loads((run / "summary.json").read_text())


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_a_version_1_run_resumes_bit_identical_to_an_uninterrupted_run(tmp_path, name):
    run = write_version_1_run(tmp_path / name, CONFIGS[name])
    summary = resume(run)
    straight = hasfl_ray.simulate({**COMMON, **CONFIGS[name]})  # made here, alongside
    assert summary["rounds"] == 4 and summary["params_sha256"] == straight["params_sha256"]


@pytest.fixture(scope="module")
def stored_runs_resumed(tmp_path_factory):
    """The stored version-1 fixtures, copied and resumed: name -> (run directory, summary)."""
    resumed = {}
    for name in CONFIGS:
        run = tmp_path_factory.mktemp("v1") / name
        shutil.copytree(V1_RUNS / name, run)
        resumed[name] = run, resume(run)
    return resumed


def test_the_stored_version_1_runs_migrate_and_resume(stored_runs_resumed):
    for name, (run, summary) in stored_runs_resumed.items():
        lines = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        kept = [json.loads(line) for line in (V1_RUNS / name / "metrics.jsonl").read_text().splitlines()]
        assert summary["rounds"] == 4 and [line["round"] for line in lines] == [0, 1, 2, 3]
        assert lines[:2] == kept  # the rounds run before the interruption, as the old run wrote them


def test_the_stored_version_1_runs_end_with_their_recorded_hash(stored_runs_resumed):
    reason = other_machine(V1_RUNS / "machine.json")
    if reason:
        pytest.skip(f"the fixtures' params_sha256 were recorded on another machine type ({reason}); bit-identity "
                    "holds within one machine type and torch build, and the resume is checked against a run made "
                    "here by test_a_version_1_run_resumes_bit_identical_to_an_uninterrupted_run")
    for name, (_, summary) in stored_runs_resumed.items():
        straight = hasfl_ray.simulate({**COMMON, **CONFIGS[name]})
        assert summary["params_sha256"] == straight["params_sha256"] == V1_UNINTERRUPTED[name]


def test_a_version_1_run_with_other_options_is_refused_naming_the_option(tmp_path):
    run = tmp_path / "fedprox"
    shutil.copytree(V1_RUNS / "fedprox", run)
    result = CliRunner().invoke(main, ["simulate", "--out", str(run), "--resume", "--mu", "0.5", "--quiet"])
    assert result.exit_code == 2 and "mu 0.3 -> 0.5" in result.output, result.output


def test_config_yaml_is_the_current_version_and_a_newer_version_is_refused(tmp_path):
    out = tmp_path / "run"
    hasfl_ray.simulate({**COMMON, "rounds": 1}, algorithm="fedprox", mu=0.2, out_dir=str(out))
    text = (out / "config.yaml").read_text()
    assert text.startswith(f"config_version: {CONFIG_VERSION}\n")
    stored = yaml.safe_load(text)
    assert stored["algorithm_options"] == {"mu": 0.2} and "mu" not in stored
    # the file is a config: simulate --config replays it
    again = CliRunner().invoke(main, ["simulate", "--config", str(out / "config.yaml"), "--out",
                                      str(tmp_path / "again"), "--quiet"])
    assert again.exit_code == 0, again.output
    stored["config_version"] = CONFIG_VERSION + 1
    with pytest.raises(ConfigError, match=f"config_version {CONFIG_VERSION + 1}; expected an integer from 1 to "
                                          rf"{CONFIG_VERSION} \(a newer hasfl-ray wrote it\?\)$"):
        RunConfig.from_dict(stored)
    for odd in (0, True, None, "4"):  # not a version a newer release writes: no such guess
        stored["config_version"] = odd
        with pytest.raises(ConfigError, match=rf"config_version {odd!r}; expected an integer from 1 to "
                                              rf"{CONFIG_VERSION}$"):
            RunConfig.from_dict(stored)


@pytest.mark.parametrize("stored,expected", [
    ({"partition": "classes:2"}, {"partition": "classes-even:2"}),  # version 2's classes:K was the even rule
    ({"model": "preresnet18"}, {"model": "preresnet18", "sbn_statistics": "in_order"}),  # its sBN pass went in order
    ({"model": "preresnet18", "model_norm": "gn"}, {"model": "preresnet18", "model_norm": "gn"}),  # no sBN: nothing
    # a plug-in dataset's own model (a model_config with norm sbn had the same in-order pass) or a plug-in model
    ({"dataset": "my_data.py:Data"}, {"dataset": "my_data.py:Data", "sbn_statistics": "in_order"}),
    ({"model": "my_net.py:Net"}, {"model": "my_net.py:Net", "sbn_statistics": "in_order"}),
    ({"dataset": "digits"}, {"dataset": "digits"}),  # a built-in dataset's own network has no sBN
    ({"algorithm": "fedrolex", "algorithm_options": {"rolex_step": 2}},
     {"algorithm": "fedrolex", "algorithm_options": {"rolex_step": 2, "rolex_direction": "forward"}}),  # +t window
    ({"algorithm": "fedrolex", "algorithm_options": {"rolex_direction": "source"}},
     {"algorithm": "fedrolex", "algorithm_options": {"rolex_direction": "source"}}),  # stated: kept
    ({"partition": "iid", "algorithm": "hasfl"}, {"partition": "iid", "algorithm": "hasfl"}),
])
def test_a_version_2_config_is_read_with_the_rules_it_ran_under(stored, expected):
    """Version 3 made the sources' rules the defaults (issue 35); a version-2 config.yaml or checkpoint keeps meaning
    what it ran: the even classes:K, the in-order sBN pass, FedRolex's +t window."""
    assert migrate_config({"config_version": 2, **stored}) == expected
    assert migrate_config({"config_version": CONFIG_VERSION, **stored}) == stored
