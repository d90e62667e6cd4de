"""A refusal names what its caller can use: ``hasfl_ray.simulate(..., out_dir=X)`` on a folder holding a run said
``--resume``/``--force``, flags the Python API does not have (its keywords are ``resume=True``/``force=True``).
The engine's sentences now ask one place, ``hasfl_ray/front_end.py``, which the CLI's group marks: flags from
``hasfl-ray``, keywords from the API, each tested from both."""

import pytest

import hasfl_ray
from hasfl_ray.errors import ConfigError
from hasfl_ray.front_end import command_line, option, resume_command
from sentences import invoke, refused

SMALL = dict(backend="local", rounds=2, clients=6, clients_per_round=3, progress=False)
FLAGS = ("--resume", "--force", "--out")


def api_refusal(**keywords):
    """The API's sentence for ``hasfl_ray.simulate(**SMALL, **keywords)``."""
    with pytest.raises(ConfigError) as caught:
        hasfl_ray.simulate(**{**SMALL, **keywords})
    message = str(caught.value)
    assert not any(flag in message for flag in FLAGS), message  # no flag the API does not have
    return message


def test_a_folder_holding_a_run(run):
    message = api_refusal(out_dir=run)
    assert "already holds a run" in message and "resume=True to continue it" in message, message
    assert "force=True to overwrite it" in message, message
    refused(invoke("simulate", "--backend", "local", "--rounds", 2, "--out", run, "--quiet"),
            "--resume to continue it", "--force to overwrite it")


def test_a_folder_that_is_no_run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "thesis.tex").write_text("x\n")
    assert "resume=True cannot continue 'notes'" in api_refusal(out_dir="notes", resume=True)
    message = api_refusal(out_dir="notes", force=True)
    assert "force=True refuses to clear 'notes'" in message and "choose another out_dir" in message, message
    assert "(choose another out_dir)" in api_refusal(out_dir="notes")
    refused(invoke("simulate", "--out", "notes", "--resume", "--quiet"), "--resume cannot continue 'notes'")
    refused(invoke("simulate", "--backend", "local", "--out", "notes", "--force", "--quiet"),
            "--force refuses to clear 'notes'", "(choose another --out)")


def test_a_resume_with_another_config_and_a_checkpoint_it_cannot_use(run):
    message = api_refusal(out_dir=run, resume=True, seed=3)
    assert "holds a run with a different config" in message and "force=True to continue it" in message, message
    refused(invoke("simulate", "--out", run, "--resume", "--seed", 3, "--quiet"), "--force to continue it")
    message = api_refusal(out_dir=run, resume=True, force=True, rounds=1)
    assert "force=True without resume=True to start again" in message, message
    refused(invoke("simulate", "--out", run, "--resume", "--force", "--rounds", 1, "--quiet"),
            "--force without --resume to start again")


def test_the_command_lines_mark_ends_with_the_command(run):
    """A command run in this process (click's runner) leaves the API's wording to what runs after it."""
    refused(invoke("simulate", "--backend", "local", "--rounds", 2, "--out", run, "--quiet"), "--resume")
    assert "resume=True" in api_refusal(out_dir=run)
    assert (option("resume"), option("force"), option("out")) == ("resume=True", "force=True", "out_dir")
    assert resume_command("a b") == "hasfl_ray.simulate(..., out_dir='a b', resume=True)"
    with command_line():
        assert (option("resume"), option("force"), option("out")) == ("--resume", "--force", "--out")
        assert resume_command("a b") == "hasfl-ray simulate --out 'a b' --resume"
    assert option("force") == "force=True"
