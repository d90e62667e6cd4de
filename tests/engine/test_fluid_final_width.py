"""clients.csv's ``p_final`` is a client's width at its last participation (docs/metrics.md "Which width"), and its
local accuracy is scored there. FLuID hands a non-straggler the full model (width 1) and a straggler its p, whatever
the client's p^max: its ``p_final`` was its p^max (0.5 for a client that trained width 1 in every round), so the
league's local mean and worst scored the width-0.5 prefix of a client that never trained one (h57)."""

import csv

import pytest

from hasfl_ray.algorithms.fluid import FLuID
from hasfl_ray.engine import Engine, RunConfig


@pytest.mark.parametrize("devices, assignment", [(None, "fixed"), ("lognormal", "fixed"), (None, "dynamic")],
                         ids=["lowest-pmax", "clock", "dynamic"])
def test_fluid_p_final_is_the_width_of_the_last_participation(tmp_path, monkeypatch, devices, assignment):
    handed = {}  # client -> the width allocate handed it last
    allocate = FLuID.allocate

    def recording(self, round, participants):
        widths = allocate(self, round, participants)
        handed.update({int(client): float(width) for client, width in widths.items()})
        return widths

    monkeypatch.setattr(FLuID, "allocate", recording)
    out = tmp_path / "run"
    Engine(RunConfig(backend="local", algorithm="fluid", rounds=5, clients=6, clients_per_round=3,
                     widths=[1.0, 0.5, 0.25], devices=devices,
                     width_assignment=assignment), out_dir=str(out)).run()
    with open(out / "clients.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    # the run's point: some client's last width is not its p^max (a middle-tier client trains the full model)
    assert any(handed[int(row["client"])] != float(row["p_max"]) for row in rows if int(row["client"]) in handed)
    for row in rows:
        client = int(row["client"])
        # a client that never took part: the width FLuID hands a non-straggler before its first round, the full model
        expected = handed.get(client, 1.0)
        assert float(row["p_final"]) == expected, (client, row["p_max"], row["p_final"], expected)
        if row["local_width"] != "":
            assert float(row["local_width"]) == expected
