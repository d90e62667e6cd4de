"""`simulate` without --out: one folder per configuration (runs/<dataset>-<algorithm>-s<seed>-<8 hex>), runs/latest
linking the last run started, the refusal of a folder that holds a run kept for an explicit --out only, and
--resume alone continuing the configuration's own folder (issue 45 item 1)."""

import json
import os

from click.testing import CliRunner

from hasfl_ray.cli.main import main
from hasfl_ray.cli.run_folder import config_digest, default_out
from hasfl_ray.engine import RunConfig

TINY = ["--backend", "local", "--rounds", "2", "--clients", "6", "--clients-per-round", "3", "--quiet"]


def simulate(*args):
    return CliRunner().invoke(main, ["simulate", *TINY, *args])


def sha(folder):
    with open(os.path.join(folder, "summary.json"), encoding="utf-8") as handle:
        return json.load(handle)["params_sha256"]


def test_two_configurations_never_share_the_default_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    first, second = simulate(), simulate("--no-coverage")
    assert first.exit_code == 0, first.output
    assert second.exit_code == 0, second.output  # was: "run directory ... already holds a run", exit 2
    folders = sorted(name for name in os.listdir("runs") if name != "latest")
    assert len(folders) == 2 and all(name.startswith("digits-hasfl-s42-") for name in folders)
    config = RunConfig(backend="local", rounds=2, clients=6, clients_per_round=3).resolved()
    assert default_out(config) in (os.path.join("runs", name) for name in folders)
    assert os.readlink(os.path.join("runs", "latest")) in folders
    assert os.path.realpath("runs/latest") == os.path.realpath(second.output.split("run directory")[-1].strip())


def test_the_digest_is_of_the_result_and_not_of_how_it_runs():
    base = RunConfig(backend="local", rounds=2, clients=6, clients_per_round=3).resolved()
    same = RunConfig(backend="local", rounds=2, clients=6, clients_per_round=3, checkpoint_every=1,
                     data_dir="elsewhere").resolved()
    other = RunConfig(backend="local", rounds=3, clients=6, clients_per_round=3).resolved()
    assert config_digest(base) == config_digest(same) != config_digest(other)
    assert default_out(base) == default_out(same) != default_out(other)
    explicit = RunConfig(backend="local", rounds=2, clients=6, clients_per_round=3, data_seed=42).resolved()
    apart = RunConfig(backend="local", rounds=2, clients=6, clients_per_round=3, data_seed=7).resolved()
    assert default_out(explicit) == default_out(base)  # --data-seed equal to --seed is the default's run
    assert default_out(apart).startswith(os.path.join("runs", "digits-hasfl-s42-d7-"))


def test_the_same_configuration_again_starts_over_in_its_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    first = simulate()
    out = os.readlink("runs/latest")
    before = sha(os.path.join("runs", out))
    again = simulate()
    assert again.exit_code == 0, again.output
    assert "holds an earlier run of this configuration" in again.output
    assert sorted(os.listdir("runs")) == sorted([out, "latest"]) and first.exit_code == 0
    assert sha(os.path.join("runs", out)) == before


def test_an_explicit_out_keeps_the_refusal(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert simulate("--out", "runs/a").exit_code == 0
    again = simulate("--out", "runs/a", "--no-coverage")
    assert again.exit_code == 2 and "already holds a run" in again.output
    assert os.readlink("runs/latest") == "a"  # an explicit folder under runs/ is the last run started too


def test_resume_alone_continues_the_configurations_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert simulate().exit_code == 0
    out = os.path.join("runs", os.readlink("runs/latest"))
    resumed = simulate("--resume")
    assert resumed.exit_code == 0, resumed.output
    assert f"run directory   {out}" in resumed.output and "earlier run" not in resumed.output
    assert sorted(os.listdir("runs")) == sorted([os.path.basename(out), "latest"])


def test_a_latest_that_is_not_a_link_is_left_alone(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    os.makedirs("runs/latest")
    (tmp_path / "runs" / "latest" / "mine.txt").write_text("keep")
    result = simulate()
    assert result.exit_code == 0, result.output
    assert os.path.isdir("runs/latest") and not os.path.islink("runs/latest")
    assert os.listdir("runs/latest") == ["mine.txt"]


def test_a_sweeps_default_folder_names_the_flags_that_change_its_cells():
    """runs/<config name> for the config as written (the folder docs/reproducing.md names), and beside it one per set
    of result-changing flags: a small try (--rounds 5) never lands in the whole sweep's folder."""
    from hasfl_ray.sweep import plan_sweep

    config = os.path.join(os.path.dirname(__file__), "..", "..", "configs", "table3-allocation.yaml")  # sweep.out
    whole = plan_sweep(config, {}, ["digits"], None, None, None).out
    small = plan_sweep(config, {"rounds": 5}, ["digits"], None, None, None).out
    again = plan_sweep(config, {"rounds": 5, "data_dir": "elsewhere"}, ["digits"], None, None, None).out
    other = plan_sweep(config, {"rounds": 6}, ["digits"], None, None, None).out
    assert whole == os.path.join("runs", "table3-allocation")
    assert small.startswith(whole + "-") and len(small) == len(whole) + 9
    assert small == again != other
    assert plan_sweep(config, {"rounds": 5}, ["digits"], None, None, "runs/try").out == "runs/try"


def test_the_same_configuration_again_never_clears_an_unfinished_run(tmp_path, monkeypatch):
    """h56: a run killed after its checkpoints (SIGKILL, OOM: no resume command printed) was cleared by running the
    same command again, 61 rounds of 400 lost; now the command is refused, the folder untouched, and --resume
    continues it (--force starts it again)."""
    monkeypatch.chdir(tmp_path)
    assert simulate().exit_code == 0
    out = os.path.join("runs", os.readlink("runs/latest"))
    finished = sha(out)
    os.remove(os.path.join(out, "summary.json"))  # as a kill after the last checkpoint leaves it
    files = {name: open(os.path.join(out, name), "rb").read() for name in ("metrics.jsonl", "checkpoints/latest.pt")}
    again = simulate()
    assert again.exit_code == 2 and "Traceback" not in again.output
    assert again.output.strip() == (f"Error: {out} holds an unfinished run of this configuration (a checkpoint, no "
                                    "summary.json); expected --resume to continue it, or --force to start it again")
    assert {name: open(os.path.join(out, name), "rb").read() for name in files} == files
    assert not os.path.exists(os.path.join(out, "summary.json"))
    resumed = simulate("--resume")
    assert resumed.exit_code == 0, resumed.output
    assert sha(out) == finished
    os.remove(os.path.join(out, "summary.json"))
    forced = simulate("--force")
    assert forced.exit_code == 0, forced.output
    assert sha(out) == finished and sorted(os.listdir("runs")) == sorted([os.path.basename(out), "latest"])
