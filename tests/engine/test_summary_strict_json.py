"""summary.json is strict JSON (issue 37 item 6): a number that is not finite (a time to an accuracy never reached,
a diverged loss) is written as null, never as Infinity or NaN, which JSON readers other than Python's refuse."""

import json
import math

from hasfl_ray.engine.rundir import RunDirectory


def test_non_finite_numbers_are_null_in_summary_json(tmp_path):
    (tmp_path / "run").mkdir()
    rundir = RunDirectory(str(tmp_path / "run"))
    rundir.write_summary({"final_accuracy": 0.5, "final_loss": math.nan, "time_to_accuracy_s": {"0.9": math.inf},
                          "per_tier": [1.0, -math.inf], "rounds": 3})
    text = (tmp_path / "run" / "summary.json").read_text()
    assert "Infinity" not in text and "NaN" not in text
    summary = json.loads(text, parse_constant=lambda name: (_ for _ in ()).throw(ValueError(name)))
    assert summary == {"final_accuracy": 0.5, "final_loss": None, "time_to_accuracy_s": {"0.9": None},
                       "per_tier": [1.0, None], "rounds": 3}
