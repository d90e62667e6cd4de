"""``--algorithm fluid`` refuses what it cannot run in one sentence with exit status 2, before a run directory is
written: the asynchronous mode (FLuID's bookkeeping is per round) and options out of range."""

import pytest

from sentences import invoke, refused


@pytest.mark.parametrize("args, words", [
    (["--mode", "async", "--devices", "lognormal"], ["algorithm fluid runs in rounds and mode is 'async'; expected mode sync"]),
    (["--estimator", "common-core"], ["algorithm fluid trains channel index sets and estimator is 'common-core'; "
                                      "expected estimator masked"]),
    (["--classifier-aggregation", "label_split", "--partition", "classes:5"],
     ["algorithm fluid trains channel index sets and classifier_aggregation is 'label_split'"]),
    (["--algo-opt", "fluid_quorum=0"], ["fluid_quorum", "expected a fraction in (0, 1]"]),
    (["--algo-opt", "fluid_increment_every=0"], ["fluid_increment_every"]),
])
def test_bad_fluid_runs_are_refused_in_one_sentence(tmp_path, args, words):
    result = invoke("simulate", "--algorithm", "fluid", "--rounds", 1, "--clients", 4, "--clients-per-round", 2,
                    "--backend", "local", "--quiet", "--out", tmp_path / "run", *args)
    refused(result, *words)
    assert not (tmp_path / "run" / "summary.json").exists()
