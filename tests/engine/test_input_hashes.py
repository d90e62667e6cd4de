"""Inputs known by their content (issue 37 item 4): the sha256 of a device trace (and of a plug-in's FILE.py) is in
config.yaml; --resume after the file changed is refused in one sentence naming it, and a sweep cell made from another
version of it is not reused."""

import shutil

import yaml
from click.testing import CliRunner

from hasfl_ray.cli.main import main
from hasfl_ray.config import RunConfig
from hasfl_ray.config.inputs import file_sha256

SAMPLE = "configs/devices/sample-trace.csv"


def test_config_yaml_records_the_traces_hash_and_resume_refuses_a_changed_trace(tmp_path):
    trace = tmp_path / "trace.csv"
    shutil.copy(SAMPLE, trace)
    out = tmp_path / "run"
    args = ["simulate", "--backend", "local", "--clients", "4", "--clients-per-round", "2", "--devices", str(trace),
            "--checkpoint-every", "1", "--quiet", "--out", str(out)]
    first = CliRunner().invoke(main, args + ["--rounds", "2"])
    assert first.exit_code == 0, first.output
    stored = yaml.safe_load((out / "config.yaml").read_text())
    assert stored["input_sha256"] == {"devices": file_sha256(str(trace))}
    again = CliRunner().invoke(main, ["simulate", "--out", str(out), "--resume", "--quiet"])
    assert again.exit_code == 0, again.output  # the same file: resumes
    trace.write_text(trace.read_text().replace("0.15", "0.25", 1))
    changed = CliRunner().invoke(main, ["simulate", "--out", str(out), "--resume", "--quiet"])
    message = changed.output.strip()
    assert changed.exit_code == 2 and len(message.splitlines()) == 1 and "Traceback" not in message, message
    assert f"devices file {str(trace)!r} changed since the run began" in message


def test_runs_without_input_files_have_no_hashes_and_plugins_are_hashed(tmp_path):
    assert RunConfig(backend="local").resolved().input_sha256 is None
    plugin = tmp_path / "policy.py"
    shutil.copy("examples/loss_policy.py", plugin)
    config = RunConfig(backend="local", algorithm=f"{plugin}:LossPolicy").resolved()
    assert config.input_sha256 == {"algorithm": file_sha256(str(plugin))}
