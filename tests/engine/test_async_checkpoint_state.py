"""An asynchronous run's checkpoint is checked whole on --resume, as the clock's own fields are (issue 49 item 3): a
tampered loop state (its version, clients in flight, end times, buffer, kept FedAsync versions, a missing or partial
block) is one sentence and exit 2 with nothing changed; --resume --force across modes is refused and leaves the run
resumable; a change of options the state does not fit is refused, one it fits continues."""

import os
import shutil
import signal

import pytest
import torch
from click.testing import CliRunner

from hasfl_ray.cli.main import main
from hasfl_ray.engine import Engine, RunConfig
from hasfl_ray.engine.asynchronous import AsyncLoop
from hasfl_ray.engine.checkpoint import checkpoint_path, load_checkpoint
from hasfl_ray.errors import RunInterrupted

from test_checkpoint import snapshot, summary

#: The battery's ASYNC config, shorter (hostile-battery-5.md): FedBuff K = 2 of C = 4 in flight.
ASYNC = dict(backend="local", mode="async", devices="lognormal", clients=10, clients_per_round=4, concurrency=4,
             buffer_size=2, rounds=12, checkpoint_every=3, local_epochs=1, seed=5)


def stopped_run(out, **changes):
    """An asynchronous run stopped by SIGTERM during server update 6 (its checkpoint after 7 updates, 12 asked)."""
    config = RunConfig(**{**ASYNC, **changes})
    with pytest.MonkeyPatch.context() as patch:
        original = AsyncLoop.server_update

        def signalling(self, wall_start):
            if self.state.version == 6:
                os.kill(os.getpid(), signal.SIGTERM)
            return original(self, wall_start)

        patch.setattr(AsyncLoop, "server_update", signalling)
        with pytest.raises(RunInterrupted) as stop:
            Engine(config, out_dir=str(out)).run()
    assert stop.value.signal_number == signal.SIGTERM and stop.value.done == "7 server updates"
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The FedBuff and FedAsync runs stopped after 7 updates, and FedBuff's uninterrupted sha (copied by each test
    before it tampers)."""
    base = tmp_path_factory.mktemp("async-stopped")
    fedbuff = stopped_run(base / "fedbuff")
    fedasync = stopped_run(base / "fedasync", async_rule="fedasync", buffer_size=None)
    reference = Engine(RunConfig(**ASYNC), out_dir=str(base / "reference")).run()
    return {"fedbuff": fedbuff, "fedasync": fedasync, "reference": reference["params_sha256"]}


def loop_state(values):
    return values["clock"]["async"]


def first_trained(values):
    """The first client in flight that trained (neither dropped out nor waiting)."""
    return next(e for e in loop_state(values)["in_flight"] if e["result"] is not None)


TAMPERED = {
    "no loop state": (lambda v: v["clock"].pop("async"), "it holds no asynchronous loop state"),
    "partial block": (lambda v: loop_state(v).pop("buffer"), "its asynchronous state lacks buffer"),
    "not a mapping": (lambda v: v["clock"].update({"async": [1, 2]}), "its asynchronous state is a list"),
    "negative version": (lambda v: loop_state(v).update(version=-3),
                         "its asynchronous state's version is -3 after 7 server updates"),
    "version beyond rounds": (lambda v: loop_state(v).update(version=1000),
                              "its asynchronous state's version is 1000 after 7 server updates"),
    "version a float": (lambda v: loop_state(v).update(version=7.0), "its asynchronous state's version is 7"),
    "in-flight version 10^6": (lambda v: loop_state(v)["in_flight"][0].update(version=10 ** 6),
                               "its in-flight entry 0 started from model version 1000000, after the 7 made"),
    "unknown client": (lambda v: loop_state(v)["in_flight"][0].update(client=999),
                       "its in-flight entry 0 is client 999 of a run of 10 clients"),
    "negative end time": (lambda v: loop_state(v)["in_flight"][0].update(end_s=-1e9),
                          "its in-flight entry 0's end_s is -1e+09, not a time at or after its start_s"),
    "NaN end time": (lambda v: loop_state(v)["in_flight"][0].update(end_s=float("nan")),
                     "its in-flight entry 0's end_s is nan"),
    "NaN last update": (lambda v: loop_state(v).update(last_update_s=float("nan")),
                        "its asynchronous state's last_update_s is nan"),
    "negative counter": (lambda v: loop_state(v).update(dropped=-1), "its asynchronous state's dropped is -1"),
    "a client twice": (lambda v: loop_state(v)["in_flight"].append(dict(loop_state(v)["in_flight"][0])),
                       "in flight twice"),
    "trained result lost": (lambda v: first_trained(v).update(result=None), "holds no trained result"),
    "another client's result": (lambda v: first_trained(v)["result"].update(client=first_trained(v)["client"] + 1),
                                "'s result is client"),
    "sent of 3 clients": (lambda v: loop_state(v).update(sent={"__ndarray__": torch.zeros(3, dtype=torch.int64)}),
                          "its asynchronous state's sent has shape (3,) for 10 clients"),
    "history not updates": (lambda v: v["history"][2].pop("staleness_max"),
                            "its history line 2 has staleness_max None, not server update 2's"),
    "full buffer": (lambda v: loop_state(v).update(buffer=[dict(first_trained(v), end_s=0.0, start_s=0.0)] * 2),
                    "its asynchronous state's buffer holds 2 updates but buffer_size is 2"),
}


def resume_refused(out, words, *flags):
    """``simulate --out OUT --resume FLAGS``: one line, exit 2, no traceback, holding ``words``; nothing changed."""
    before = snapshot(out)
    result = CliRunner().invoke(main, ["simulate", "--out", str(out), "--resume", "--quiet", *flags])
    message = result.output.strip()
    assert result.exit_code == 2, message
    assert len(message.splitlines()) == 1 and "Traceback" not in message, message
    assert words in message, message
    assert snapshot(out) == before
    return message


def tampered_copy(source, out, tamper):
    shutil.copytree(source, out)
    path = checkpoint_path(str(out))
    values = torch.load(path, weights_only=True)
    tamper(values)
    torch.save(values, path)
    return path


@pytest.mark.parametrize("how", list(TAMPERED))
def test_a_tampered_loop_state_is_one_sentence_and_nothing_changes(runs, tmp_path, how):
    tamper, words = TAMPERED[how]
    path = tampered_copy(runs["fedbuff"], tmp_path / "run", tamper)
    message = resume_refused(tmp_path / "run", words)
    assert f"checkpoint {path!r} does not match this run" in message
    assert "expected the asynchronous loop's state this run wrote" in message


@pytest.mark.parametrize("how, tamper, words", [
    ("no kept versions", lambda v: loop_state(v).update(versions={}), "has 0 holders but 1 of its clients"),
    ("a kept version's parameter NaN",
     lambda v: next(iter(next(iter(loop_state(v)["versions"].values()))[0].values())).fill_(float("nan")),
     "is not the model's, finite"),
])
def test_fedasyncs_kept_versions_are_checked(runs, tmp_path, how, tamper, words):
    tampered_copy(runs["fedasync"], tmp_path / "run", tamper)
    resume_refused(tmp_path / "run", words)


def test_the_untouched_checkpoints_resume_bit_for_bit(runs, tmp_path):
    shutil.copytree(runs["fedbuff"], tmp_path / "run")
    result = CliRunner().invoke(main, ["simulate", "--out", str(tmp_path / "run"), "--resume", "--quiet"])
    assert result.exit_code == 0, result.output
    assert summary(tmp_path / "run")["params_sha256"] == runs["reference"]


def test_a_synchronous_checkpoint_is_not_continued_asynchronously(tmp_path):
    """Battery 5 problem 1: --resume --force --mode async on a synchronous run's checkpoint ran the asynchronous
    loop from version 0 on top of its rounds and left a run that could not be resumed. Refused; a plain --resume
    then finishes it as a run never stopped."""
    keys = dict(backend="local", devices="lognormal", clients=10, clients_per_round=4, rounds=6, seed=5,
                checkpoint_every=2, local_epochs=1)
    reference = Engine(RunConfig(**keys), out_dir=str(tmp_path / "reference")).run()
    original = Engine.run_round

    def signalling(self, t):
        if t == 2:
            os.kill(os.getpid(), signal.SIGTERM)
        return original(self, t)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Engine, "run_round", signalling)
        with pytest.raises(RunInterrupted):
            Engine(RunConfig(**keys), out_dir=str(tmp_path / "run")).run()
    assert load_checkpoint(str(tmp_path / "run")).round == 2  # round 2 stopped at its first client
    resume_refused(tmp_path / "run", "holds a run in mode 'sync' (2 completed rounds) but mode is 'async'",
                   "--force", "--mode", "async", "--rounds", "30")
    result = CliRunner().invoke(main, ["simulate", "--out", str(tmp_path / "run"), "--resume", "--quiet"])
    assert result.exit_code == 0, result.output
    assert summary(tmp_path / "run")["params_sha256"] == reference["params_sha256"]


def test_an_asynchronous_checkpoint_is_not_continued_in_rounds(runs, tmp_path):
    out = tmp_path / "run"
    shutil.copytree(runs["fedbuff"], out)
    resume_refused(out, "mode is 'sync'", "--force", "--mode", "sync")
    run = Engine(RunConfig(**{**ASYNC, "mode": "sync", "concurrency": None, "buffer_size": None}),
                 out_dir=str(out), resume=True, force=True)
    with pytest.raises(Exception, match="holds a run in mode 'async' \\(7 server updates\\) but mode is 'sync'"):
        run.prepare()
    result = CliRunner().invoke(main, ["simulate", "--out", str(out), "--resume", "--quiet"])
    assert result.exit_code == 0, result.output
    assert summary(out)["params_sha256"] == runs["reference"]


@pytest.mark.parametrize("flags, words", [
    (["--async-rule", "fedasync", "--buffer-size", "1"], "it keeps no model versions, which async_rule 'fedasync'"),
    (["--concurrency", "2"], "holds 3 clients in flight but concurrency is 2"),
])
def test_options_the_loop_state_does_not_fit_are_refused_under_force(runs, tmp_path, flags, words):
    out = tmp_path / "run"
    shutil.copytree(runs["fedbuff"], out)
    resume_refused(out, words, "--force", *flags)


def test_options_the_loop_state_fits_continue_under_force_and_resume_again(runs, tmp_path):
    """A smaller buffer (the checkpoint's is empty) continues; the run it leaves resumes and reports as any."""
    out = tmp_path / "run"
    shutil.copytree(runs["fedbuff"], out)
    result = CliRunner().invoke(main, ["simulate", "--out", str(out), "--resume", "--force", "--buffer-size", "1",
                                       "--quiet"])
    assert result.exit_code == 0, result.output
    assert summary(out)["server_updates"] == 12
    again = CliRunner().invoke(main, ["simulate", "--out", str(out), "--resume", "--quiet"])
    assert again.exit_code == 0, again.output
