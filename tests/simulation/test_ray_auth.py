"""Ray's token authentication cannot be turned off silently: RAY_AUTH_MODE=disabled gets a warning naming what is
exposed and how to keep the ports private, before Ray starts (the run goes on: the user asked for it)."""

import logging
import os
import subprocess
import sys

import pytest

from hasfl_ray.simulation import AUTH_OFF_WARNING, quiet_token_notice

#: The repository's `python cli ...` shim: the CLI in a fresh interpreter.
CLI = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "cli")


def test_the_warning_fires_only_when_auth_is_off(monkeypatch, caplog):
    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    with caplog.at_level(logging.WARNING, logger="hasfl_ray"):
        quiet_token_notice()
    assert AUTH_OFF_WARNING not in caplog.text
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    with caplog.at_level(logging.WARNING, logger="hasfl_ray"):
        quiet_token_notice()
    assert caplog.text.count(AUTH_OFF_WARNING) == 1
    assert "6379" in AUTH_OFF_WARNING and "loopback" in AUTH_OFF_WARNING and "firewall" in AUTH_OFF_WARNING


def test_a_ray_run_with_auth_off_warns_in_its_log(tmp_path):
    """In a process of its own: Ray reads RAY_AUTH_MODE once per process, so setting it here would leave every later
    ray.init of the test session in that mode."""
    pytest.importorskip("ray", reason="needs Ray")
    # HASFL_HANDOFF_ROUND=0: Ray starts at once (a one-round run would end before it: docs/ray.md, 'Start-up'); the
    # warning then comes from Ray's start in the background, after RUN/log.txt was opened
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "HASFL_HANDOFF_ROUND": "0"}
    done = subprocess.run([sys.executable, CLI, "simulate", "--backend", "ray", "--actors", "1",
                           "--rounds", "1", "--clients", "4", "--clients-per-round", "2", "--quiet", "--out",
                           str(tmp_path / "run")], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "RAY_AUTH_MODE=disabled: this Ray instance answers unauthenticated requests" in done.stderr
    log = (tmp_path / "run" / "log.txt").read_text()
    assert "WARNING hasfl_ray.simulation: RAY_AUTH_MODE=disabled: this Ray instance answers unauthenticated" in log
