"""A sweep cell's status lines count what its mode counts (issue h59): an asynchronous cell stopped "after 10 server
updates" was then "resumed after round 10"."""

from hasfl_ray.sweep import Cell, describe_result

SUMMARY = {"best_accuracy": 0.9, "final_accuracy": 0.8, "avg_p": 0.5}


def cell(**values):
    return Cell(name="digits-fa-seed42", dataset="digits", algorithm="fiarse", seed=42, dir="/nonexistent",
                values=values)


def test_an_asynchronous_cell_is_interrupted_and_resumed_after_server_updates():
    stopped = describe_result(cell(mode="async"), {"status": "interrupted", "rounds_done": 10})
    assert stopped == ("digits-fa-seed42: interrupted after 10 server updates (the next run of the sweep resumes it "
                       "from its checkpoint)")
    resumed = describe_result(cell(mode="async"), {"status": "resumed", "from_round": 10, "wall_s": 12.4,
                                                   "summary": SUMMARY})
    assert resumed == ("digits-fa-seed42: resumed in 12.4 s (resumed after server update 10): best 0.9000, final "
                       "0.8000, avg p 0.500")


def test_a_synchronous_cell_is_resumed_after_a_round():
    for values in ({}, {"mode": "sync"}):
        line = describe_result(cell(**values), {"status": "resumed", "from_round": 4, "wall_s": 1.0,
                                                "summary": SUMMARY})
        assert "(resumed after round 4)" in line


def test_a_failed_cell_names_its_own_log(tmp_path, monkeypatch):
    """A cell whose plug-in raised said "its traceback is in RUN/log.txt": which RUN, of the sweep's cells? Its line
    names the cell's own log.txt, which holds the traceback."""
    import os

    from sentences import invoke

    monkeypatch.chdir(tmp_path)
    (tmp_path / "policy.py").write_text("from hasfl_ray import Algorithm\n\n\nclass Boom(Algorithm):\n"
                                        "    def allocate(self, round, participants):\n"
                                        "        raise ValueError('boom in allocate')\n")
    (tmp_path / "plan.yaml").write_text("dataset: digits\nrounds: 1\nclients: 6\nclients_per_round: 3\n"
                                        "backend: local\nsweep:\n  algorithms: [mine]\n  seeds: [42]\n"
                                        f"  variants:\n    mine: {{algorithm: {tmp_path / 'policy.py'}:Boom}}\n")
    result = invoke("sweep", "plan.yaml", "--out", "sweep", "--quiet", "--backend", "local")
    assert result.exit_code != 0
    log = os.path.join("sweep", "digits-mine-seed42", "log.txt")
    assert f"its traceback is in {log}" in result.output and "RUN/" not in result.output, result.output
    with open(log, encoding="utf-8") as handle:
        assert "boom in allocate" in handle.read()
