"""What a run shows while it runs (issue 45 item 5): where the bar's stream is not a terminal, one line per round
(never tqdm's ``\\r`` frames); an asynchronous run shows its server updates; summary.json's ``startup_s`` times the
start-up (data, model, Ray) apart from the rounds' ``wall_s``."""

import io

from click.testing import CliRunner

from hasfl_ray.cli.main import main
from hasfl_ray.engine import Engine, RunConfig
from hasfl_ray.engine.progress import LineProgress, mark_run_start, open_bar, startup_seconds

SMALL = dict(backend="local", clients=6, clients_per_round=3, rounds=3, seed=2)


def test_off_a_terminal_each_round_is_one_line(capsys):
    Engine(RunConfig(**SMALL), progress=True).run()
    err = capsys.readouterr().err
    assert "\r" not in err
    lines = [line for line in err.splitlines() if line.startswith("hasfl on digits: round ")]
    assert [line.split(",")[0] for line in lines] == [f"hasfl on digits: round {k}/3" for k in (1, 2, 3)]
    assert all("acc=" in line and "loss=" in line for line in lines)
    assert "left)" in lines[0] and "left" not in lines[-1]  # an estimate until the last round


def test_an_asynchronous_run_shows_its_server_updates(capsys):
    Engine(RunConfig(**SMALL, mode="async", devices="lognormal", concurrency=3, buffer_size=2), progress=True).run()
    lines = [line for line in capsys.readouterr().err.splitlines() if "server update " in line]
    assert [line.split(",")[0].split(": ")[1] for line in lines] == [f"server update {k}/3" for k in (1, 2, 3)]


def test_the_cli_off_a_terminal_prints_a_line_a_round(tmp_path):
    result = CliRunner().invoke(main, ["simulate", "--backend", "local", "--rounds", "2", "--clients", "6",
                                       "--clients-per-round", "3", "--out", str(tmp_path / "run")])
    assert result.exit_code == 0, result.output
    assert "\r" not in result.output
    assert "hasfl on digits: round 1/2, " in result.output and "hasfl on digits: round 2/2, " in result.output


class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_on_a_terminal_the_bar_is_tqdms():
    engine = Engine(RunConfig(**SMALL), progress=True)
    bar = open_bar(engine, "round", stream=Terminal())
    assert not isinstance(bar, LineProgress) and type(bar).__name__ == "tqdm"
    bar.close()
    assert open_bar(Engine(RunConfig(**SMALL), progress=False), "round") is None


def test_startup_is_counted_apart_from_the_rounds():
    engine = Engine(RunConfig(**SMALL))
    summary = engine.run()  # prepare runs inside run: part of the start-up
    assert summary["startup_s"] >= engine.prepare_s > 0
    assert summary["wall_s"] > 0
    prepared = Engine(RunConfig(**SMALL))
    prepared.prepare()
    prepared.prepare_s = 1000.0  # a prepare made before run counts once, however long ago it ran
    mark_run_start(prepared)
    prepared._loop_start = prepared._run_start + 1000.0 + 2.5
    assert abs(startup_seconds(prepared) - 1002.5) < 1e-6


def test_a_sweep_off_a_terminal_prints_a_line_per_cell_and_no_bar(tmp_path):
    import yaml

    config = tmp_path / "tiny.yaml"
    config.write_text(yaml.safe_dump({"sweep": {"datasets": ["digits"], "algorithms": ["hasfl"], "seeds": [1, 2]}}))
    result = CliRunner().invoke(main, ["sweep", str(config), "--rounds", "1", "--clients", "6", "--clients-per-round",
                                       "3", "--backend", "local", "--out", str(tmp_path / "sweep")])
    assert result.exit_code == 0, result.output
    assert "\r" not in result.output and "cell/s" not in result.output and "it/s" not in result.output
    assert sum(line.startswith(("[1/2] ", "[2/2] ")) for line in result.output.splitlines()) == 2
