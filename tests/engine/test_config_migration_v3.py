"""config_version 4: ScaleFL on a ResNet builds its source's exit heads (``scalefl_exit_head: source``, 2026-11-30),
so a version-3 run of ScaleFL on a ResNet, which built DepthFL's heads and stored no ``scalefl_exit_head``, is read
with the heads it ran (hasfl_ray/config/migrate.py::_version_3_rules): it resumes to the result it would have given
uninterrupted. Every other version-3 config reads as it is. Resumes are compared with uninterrupted runs made on the spot (docs/design.md, Determinism)."""

from __future__ import annotations

import json

import yaml
from click.testing import CliRunner

from hasfl_ray.cli.main import main
from hasfl_ray.config import CONFIG_VERSION, RunConfig, migrate_config
from hasfl_ray.engine.checkpoint import load_checkpoint, save_checkpoint

RUN = ["simulate", "--dataset", "digits", "--rounds", "3", "--clients", "6", "--clients-per-round", "3",
       "--checkpoint-every", "1", "--quiet", "--backend", "local"]
#: A small ResNet ScaleFL run (tests/engine/test_depthfl_scalefl_runs.py's ``scalefl-resnet``).
SCALEFL_RESNET = ["--algorithm", "scalefl", "--model", "preresnet18", "--global-width", "0.25",
                  "--widths", "0.0625,0.125,0.1875,0.25", "--algo-opt", "scalefl_exits=1,2,3,4"]


def version_3(values):
    """A config of today as version 3 wrote it: ``config_version: 3`` and no ``scalefl_exit_head``."""
    options = {k: v for k, v in values["algorithm_options"].items() if k != "scalefl_exit_head"}
    return {**values, "config_version": 3, "algorithm_options": options}


def scalefl(model="preresnet18", **options):
    values = RunConfig.from_dict({"algorithm": "scalefl", "model": model, "dataset": "cifar10"}).to_dict()
    return {**values, "algorithm_options": {**values["algorithm_options"], **options}}


def test_a_version_3_scalefl_run_on_a_resnet_reads_with_depthfls_heads():
    assert CONFIG_VERSION == 4
    stored = version_3(scalefl())
    assert migrate_config(stored)["algorithm_options"]["scalefl_exit_head"] == "depthfl"
    # version 2 and 1 files ran DepthFL's heads too (ScaleFL did not exist then, but a file may say it)
    assert migrate_config({**stored, "config_version": 2})["algorithm_options"]["scalefl_exit_head"] == "depthfl"
    # and nothing else moves
    migrated = migrate_config(stored)
    assert {k: v for k, v in migrated.items() if k != "algorithm_options"} == {
        k: v for k, v in stored.items() if k not in ("config_version", "algorithm_options")}


def test_every_other_version_3_config_reads_as_it_is():
    on_the_cnn = version_3(scalefl(model=None))  # the CNN's exits have no heads to choose
    assert "scalefl_exit_head" not in migrate_config(on_the_cnn)["algorithm_options"]
    chosen = {**version_3(scalefl()), "algorithm_options": {**version_3(scalefl())["algorithm_options"],
                                                           "scalefl_exit_head": "source"}}
    assert migrate_config(chosen)["algorithm_options"]["scalefl_exit_head"] == "source"
    depthfl = RunConfig.from_dict({"algorithm": "depthfl", "model": "preresnet18", "dataset": "cifar10"}).to_dict()
    assert migrate_config({**depthfl, "config_version": 3}) == {k: v for k, v in depthfl.items()
                                                              if k != "config_version"}
    today = scalefl()
    assert today["config_version"] == 4 and migrate_config(today) == {k: v for k, v in today.items()
                                                                     if k != "config_version"}


def test_a_stopped_version_3_scalefl_resnet_run_resumes_to_its_uninterrupted_result(tmp_path):
    """Written on the spot: today's code with DepthFL's heads stopped after round 1's checkpoint, its config.yaml and
    its checkpoint's config then rewritten as version 3 wrote them; ``--resume`` (no flag) finishes it on the heads
    it ran, bit for bit the uninterrupted run with ``scalefl_exit_head=depthfl``."""
    depthfl_heads = SCALEFL_RESNET + ["--algo-opt", "scalefl_exit_head=depthfl"]
    whole = tmp_path / "whole"
    assert CliRunner().invoke(main, RUN + depthfl_heads + ["--out", str(whole)]).exit_code == 0
    out = tmp_path / "v3"
    crashed = CliRunner().invoke(main, RUN + depthfl_heads + ["--fault-inject", "trainer-error@2", "--out", str(out)])
    assert crashed.exit_code == 1, crashed.output
    text = (out / "config.yaml").read_text(encoding="utf-8")
    execution = text[text.index("# execution"):]
    (out / "config.yaml").write_text(yaml.safe_dump(version_3(yaml.safe_load(text)), sort_keys=False) + execution,
                                     encoding="utf-8")
    checkpoint = load_checkpoint(str(out))
    checkpoint.config = version_3(checkpoint.config)
    save_checkpoint(str(out), checkpoint)
    assert "scalefl_exit_head" not in yaml.safe_load((out / "config.yaml").read_text())["algorithm_options"]

    resumed = CliRunner().invoke(main, ["simulate", "--out", str(out), "--resume", "--quiet"])
    assert resumed.exit_code == 0, resumed.output
    summary = json.loads((out / "summary.json").read_text())
    assert summary["params_sha256"] == json.loads((whole / "summary.json").read_text())["params_sha256"]
    # and the default heads (the source's) would have given another result: the migration is what finished it
    source = tmp_path / "source"
    assert CliRunner().invoke(main, RUN + SCALEFL_RESNET + ["--out", str(source)]).exit_code == 0
    assert json.loads((source / "summary.json").read_text())["params_sha256"] != summary["params_sha256"]


def test_a_hand_written_version_3_config_without_algorithm_options_runs_the_heads_of_version_3(tmp_path):
    """A config file that says ``config_version: 3`` but lists no ``algorithm_options`` (or ``algorithm_options:
    null``) gave no option: version 3's defaults, so DepthFL's heads on a ResNet, bit for bit the run with
    ``scalefl_exit_head=depthfl`` (it ran the source's heads, the version-4 default, in silence); a version-2 FedRolex
    file without options keeps version 2's forward window likewise."""
    hand = {"config_version": 3, "dataset": "digits", "algorithm": "scalefl", "model": "preresnet18",
            "global_width": 0.25, "widths": [0.0625, 0.125, 0.1875, 0.25], "rounds": 1, "clients": 6,
            "clients_per_round": 3}
    depthfl = tmp_path / "depthfl"
    run = ["simulate", "--quiet", "--backend", "local"]
    made = CliRunner().invoke(main, run + ["--dataset", "digits", "--rounds", "1", "--clients", "6",
                                           "--clients-per-round", "3"] + SCALEFL_RESNET[:-2] +  # scalefl_exits auto, as the file
                              ["--algo-opt", "scalefl_exit_head=depthfl", "--out", str(depthfl)])
    assert made.exit_code == 0, made.output
    expected = json.loads((depthfl / "summary.json").read_text())["params_sha256"]
    for given in ({}, {"algorithm_options": None}):
        path = tmp_path / f"hand{len(given)}.yaml"
        path.write_text(yaml.safe_dump({**hand, **given}), encoding="utf-8")
        out = tmp_path / f"run{len(given)}"
        result = CliRunner().invoke(main, run + ["--config", str(path), "--out", str(out)])
        assert result.exit_code == 0, result.output
        assert yaml.safe_load((out / "config.yaml").read_text())["algorithm_options"]["scalefl_exit_head"] == "depthfl"
        assert json.loads((out / "summary.json").read_text())["params_sha256"] == expected
    fedrolex = {"config_version": 2, "algorithm": "fedrolex", "dataset": "cifar10", "model": "preresnet18"}
    for given in ({}, {"algorithm_options": None}):
        assert migrate_config({**fedrolex, **given})["algorithm_options"] == {"rolex_direction": "forward"}
