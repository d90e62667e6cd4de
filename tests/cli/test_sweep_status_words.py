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
