"""``sweep --force`` redoing a cell of another config cleared the cell's folder itself before the new start, so a
start refused for bad input (a plug-in's first dispatch) cost the earlier run, while ``simulate --force`` sets it
aside and puts it back. The sweep's redo is now ``simulate --force``'s start (``Engine(force=True)``,
``engine/earlier_run.py``): one way, the earlier cell kept byte for byte when its new start is refused."""

import os

from hasfl_ray.engine.earlier_run import EARLIER
from sentences import invoke
from test_force_keeps_the_earlier_run import CHANNELS, PLUGINS, files

SWEEP = ("dataset: digits\nrounds: 1\nclients: 6\nclients_per_round: 3\nbackend: local\n"
         "sweep:\n  algorithms: [mine]\n  seeds: [42]\n  variants:\n    mine: {{algorithm: {algorithm}}}\n")
ARGS = ["sweep", "plan.yaml", "--out", "sweep", "--quiet", "--backend", "local"]


def test_a_refused_redo_leaves_the_earlier_cell_as_it_was(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "policy.py").write_text(PLUGINS)
    (tmp_path / "plan.yaml").write_text(SWEEP.format(algorithm="fedavg"))
    first = invoke(*ARGS)
    assert first.exit_code == 0, first.output
    cell = tmp_path / "sweep" / "digits-mine-seed42"
    assert (cell / "summary.json").exists()
    before = files(cell)
    (tmp_path / "plan.yaml").write_text(SWEEP.format(algorithm=f"{tmp_path / 'policy.py'}:Channels"))
    redo = invoke(*ARGS, "--force")
    assert redo.exit_code != 0 and CHANNELS in redo.output, redo.output
    assert files(cell) == before  # the earlier cell back, nothing of the refused start beside it


def test_a_redo_that_finishes_leaves_only_the_new_cell(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "plan.yaml").write_text(SWEEP.format(algorithm="fedavg"))
    assert invoke(*ARGS).exit_code == 0
    (tmp_path / "plan.yaml").write_text(SWEEP.format(algorithm="uniform"))
    redo = invoke(*ARGS, "--force")
    assert redo.exit_code == 0, redo.output
    cell = tmp_path / "sweep" / "digits-mine-seed42"
    assert EARLIER not in os.listdir(cell) and "uniform" in (cell / "config.yaml").read_text()
    assert len((cell / "metrics.jsonl").read_text().splitlines()) == 1
