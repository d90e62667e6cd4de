"""An ``lr_milestones`` entry at or past a run's last round (0-based ``rounds`` - 1) is never reached by the schedule
(hasfl_ray.schedule.round_lr), so the learning rate never drops there; nothing said so (hostile battery 6: a pack's
protocol run for fewer rounds than its source's, or a typo). The run now says it in one warning line at its start, on
the terminal and in RUN/log.txt, in both modes; a milestone inside the run says nothing, and the result is unchanged."""

import json
import os

import pytest

from hasfl_ray.schedule import milestones_note, round_lr
from sentences import invoke

RUN = ["simulate", "--dataset", "digits", "--clients", "6", "--clients-per-round", "3", "--backend", "local",
       "--quiet"]


def start_warnings(run):
    return [line for line in open(os.path.join(run, "log.txt")) if "lr_milestones" in line]


@pytest.mark.parametrize("milestones, rounds, late", [([5], 5, "5"), ([1, 5], 2, "5"), ([2, 3], 2, "2, 3"),
                                                      ([1199], 1, "1199")])
def test_a_milestone_the_run_never_reaches_is_named(milestones, rounds, late):
    note = milestones_note(milestones, rounds)
    assert note is not None and len(note.split(". ")) == 1, note
    assert f"has {late} at or past the run's last round" in note and f"0 to {rounds - 1}" in note, note
    # what the note says is what the schedule does: the rate after the last round's is the rate without the milestone
    assert round_lr(0.1, 1.0, rounds - 1, milestones, 0.5) == round_lr(0.1, 1.0, rounds - 1,
                                                                      [m for m in milestones if m < rounds], 0.5)


@pytest.mark.parametrize("milestones, rounds", [(None, 5), ([], 5), ([4], 5), ([1, 2], 3)])
def test_milestones_inside_the_run_say_nothing(milestones, rounds):
    assert milestones_note(milestones, rounds) is None


@pytest.mark.parametrize("mode", [[], ["--mode", "async", "--devices", "lognormal"]])
def test_a_run_warns_at_its_start_and_trains_as_before(tmp_path, mode):
    late, inside = tmp_path / "late", tmp_path / "inside"
    result = invoke(*RUN, *mode, "--rounds", "2", "--lr-milestones", "1,7", "--out", late)
    assert result.exit_code == 0, result.output
    warned = start_warnings(late)
    assert len(warned) == 1 and "lr_milestones [1, 7] has 7 at or past" in warned[0], warned
    result = invoke(*RUN, *mode, "--rounds", "2", "--lr-milestones", "1", "--out", inside)
    assert result.exit_code == 0, result.output
    assert start_warnings(inside) == []
    sha = [json.loads((run / "summary.json").read_text())["params_sha256"] for run in (late, inside)]
    assert sha[0] == sha[1]  # a milestone past the end changes nothing: the note says so, the run does so
