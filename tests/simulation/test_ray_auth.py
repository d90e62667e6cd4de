"""Ray's token authentication cannot be turned off silently: RAY_AUTH_MODE=disabled gets a warning naming what is
exposed and how to keep the ports private, before Ray starts (the run goes on: the user asked for it)."""

import logging

import pytest
from click.testing import CliRunner

from hasfl_ray.cli.main import main
from hasfl_ray.simulation import AUTH_OFF_WARNING, quiet_token_notice


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


def test_a_ray_run_with_auth_off_warns_in_its_log(monkeypatch, tmp_path):
    pytest.importorskip("ray", reason="needs Ray")
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    result = CliRunner().invoke(main, ["simulate", "--backend", "ray", "--actors", "1", "--rounds", "1", "--clients",
                                       "4", "--clients-per-round", "2", "--quiet", "--out", str(tmp_path / "run")])
    assert result.exit_code == 0, result.output
    log = (tmp_path / "run" / "log.txt").read_text()  # the same record goes to stderr through the CLI's logging
    assert "WARNING hasfl_ray.simulation: RAY_AUTH_MODE=disabled: this Ray instance answers unauthenticated" in log
