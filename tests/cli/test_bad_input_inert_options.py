"""A league method's option that the run's other options leave without effect is refused in one sentence, exit
status 2, before the run directory is made, as every other key that does nothing is (``check_inert_keys``; h63):
FjORD's distillation weight without KD, DepthFL's FedDyn alpha without FedDyn (so in ``--mode async``, which runs
DepthFL only without it) and its distillation's temperature and ramp-up without distillation, ScaleFL's
distillation temperature and start at its default weight 0 and its exit heads on a model that is not a ResNet,
FedRolex's direction of a window that never moves and FLuID's time margin without a device clock to time anyone.
Before, each ran and did nothing."""

import os
import textwrap

import pytest

from sentences import invoke, refused

BASE = ["--rounds", 1, "--clients", 4, "--clients-per-round", 2, "--backend", "local", "--quiet"]
ASYNC = ["--mode", "async", "--devices", "lognormal", "--concurrency", 2]
SWEEP = "sweep:\n  datasets: [digits]\n  algorithms: [nokd]\n  variants: {nokd: {algorithm: fjord, "
TINY = "rounds: 1\nclients: 4\nclients_per_round: 2\n"


@pytest.mark.parametrize("args, words", [
    (["--algorithm", "fjord", "--algo-opt", "fjord_kd=false", "--fjord-distill-weight", 0.5],
     ["fjord_distill_weight is 0.5 but fjord_kd is false", "expected fjord_distill_weight unset, or fjord_kd true"]),
    (["--algorithm", "fjord", "--algo-opt", "fjord_kd=false", "--algo-opt", "fjord_distill_weight=1.0"],
     ["fjord_distill_weight is 1.0 but fjord_kd is false"]),  # its default, given: still does nothing
    (["--algorithm", "depthfl", *ASYNC, "--algo-opt", "depthfl_feddyn=false", "--algo-opt", "depthfl_alpha=0.5"],
     ["depthfl_alpha is 0.5 but depthfl_feddyn is false", "or depthfl_feddyn true"]),
    (["--algorithm", "depthfl", "--algo-opt", "depthfl_kd=false", "--algo-opt", "depthfl_temperature=2"],
     ["depthfl_temperature is 2.0 but depthfl_kd is false"]),
    (["--algorithm", "depthfl", "--algo-opt", "depthfl_kd=false", "--algo-opt", "depthfl_rampup_rounds=5"],
     ["depthfl_rampup_rounds is 5 but depthfl_kd is false"]),
    (["--algorithm", "scalefl", *ASYNC, "--algo-opt", "scalefl_kd_temperature=5"],
     ["scalefl_kd_temperature is 5.0 but scalefl_kd_gamma is 0", "or scalefl_kd_gamma > 0"]),
    (["--algorithm", "scalefl", "--algo-opt", "scalefl_kd_start=0.5"],
     ["scalefl_kd_start is 0.5 but scalefl_kd_gamma is 0"]),
    (["--algorithm", "scalefl", "--algo-opt", "scalefl_exit_head=depthfl"],  # h76: the CNN's exits have no heads
     ["scalefl_exit_head is 'depthfl' but model is unset (the image CNN's exits have no heads)",
      "or --model preresnet18, resnet18 or preresnet18-1112"]),
    (["--algorithm", "fedrolex", "--rolex-step", 0, "--algo-opt", "rolex_direction=forward"],
     ["rolex_direction is 'forward' but rolex_step is 0", "or rolex_step >= 1"]),
    (["--algorithm", "fluid", "--algo-opt", "fluid_time_margin=1.3"],
     ["fluid_time_margin is 1.3 but devices is unset", "or --devices"]),
])
def test_an_option_the_other_options_leave_without_effect_is_refused(tmp_path, args, words):
    refused(invoke("simulate", *BASE, *args, "--out", tmp_path / "run"), *words)
    assert not (tmp_path / "run").exists()


def test_an_inert_option_in_a_config_file_names_the_file(tmp_path, monkeypatch):
    """A config file's flat key and its algorithm_options mapping alike."""
    monkeypatch.chdir(tmp_path)
    for text in ("fjord_distill_weight: 0.3\n", "algorithm_options: {fjord_distill_weight: 0.3}\n"):
        (tmp_path / "c.yaml").write_text("algorithm: fjord\nfjord_kd: false\n" + text)
        refused(invoke("simulate", *BASE, "--config", "c.yaml", "--out", "run"),
                "fjord_distill_weight is 0.3 (config file 'c.yaml') but fjord_kd is false")
        assert sorted(os.listdir(".")) == ["c.yaml"]


def test_the_options_with_what_they_act_on_still_run(tmp_path, monkeypatch):
    """Each option beside what makes it act runs; a sweep config's shared option is not refused in the cells that do
    not read it (the league's shared fjord_distill_weight beside a no-KD variant), and a run's own config.yaml
    given back (it holds every option) or a Python API options instance holding defaults give no option of theirs."""
    monkeypatch.chdir(tmp_path)
    for name, args in [("a", ["--algorithm", "fjord", "--fjord-distill-weight", 0.5]),
                       ("b", ["--algorithm", "scalefl", "--algo-opt", "scalefl_kd_gamma=0.1",
                              "--algo-opt", "scalefl_kd_temperature=5"]),
                       ("c", ["--algorithm", "fluid", "--devices", "lognormal", "--algo-opt", "fluid_time_margin=1.3"]),
                       ("d", ["--algorithm", "fjord", "--algo-opt", "fjord_kd=false"])]:
        result = invoke("simulate", *BASE, *args, "--out", name)
        assert result.exit_code == 0, result.output
    result = invoke("simulate", "--config", "d/config.yaml", "--out", "e", "--quiet")  # fjord_distill_weight: 1.0 in it
    assert result.exit_code == 0, result.output
    # the config's fjord cell reads it (sweep/unused.py), so the no-KD cell run alone is not refused
    (tmp_path / "s.yaml").write_text(SWEEP.replace("[nokd]", "[fjord, nokd]") + "fjord_kd: false}}\n"
                                     "fjord_distill_weight: 1.0\n" + TINY)
    result = invoke("sweep", "s.yaml", "--backend", "local", "--quiet", "--seeds", "42", "--algorithms", "nokd",
                    "--out", "sw")
    assert result.exit_code == 0, result.output
    from hasfl_ray.algorithms.fjord import FjORDOptions
    from hasfl_ray.api import make_config

    assert make_config({"backend": "local"}, algorithm="fjord",
                       algorithm_options=FjORDOptions(fjord_kd=False)).algorithm_options["fjord_kd"] is False
    assert sorted(os.listdir(".")) == ["a", "b", "c", "d", "e", "s.yaml", "sw"]


def test_a_sweep_variants_own_inert_option_is_refused_before_any_cell(tmp_path, monkeypatch):
    """A variant's keys are its algorithm's own (not shared by several algorithms): refused in the sweep, naming the
    cell, and in `simulate --config` of that variant, with nothing written."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "s.yaml").write_text(SWEEP + "fjord_kd: false, fjord_distill_weight: 0.5}}\n" + TINY)
    refused(invoke("sweep", "s.yaml", "--backend", "local", "--quiet", "--seeds", "42", "--out", "sw"),
            "fjord_distill_weight is 0.5 (sweep cell digits-nokd-seed42) but fjord_kd is false")
    refused(invoke("simulate", "--config", "s.yaml", "--algorithm", "nokd", "--backend", "local", "--out", "run"),
            "fjord_distill_weight is 0.5", "but fjord_kd is false")
    assert sorted(os.listdir(".")) == ["s.yaml"]


def test_a_plugins_options_declare_their_own_inert_options(tmp_path, monkeypatch):
    """docs/plugins.md: a plug-in's options dataclass declares ``inert(config)`` the way the built-ins' do."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "gain.py").write_text(textwrap.dedent("""
        from dataclasses import dataclass
        from hasfl_ray.algorithms.uniform import Uniform

        @dataclass
        class GainOptions:
            boost: bool = False
            gain: float = 1.0

            def inert(self, config):
                return {} if self.boost else {"gain": ("boost is false", "boost true")}

        class Gain(Uniform):
            options_class = GainOptions
    """))
    refused(invoke("simulate", *BASE, "--algorithm", "gain.py:Gain", "--algo-opt", "gain=2", "--out", "run"),
            "gain is 2.0 but boost is false, so it does nothing; expected gain unset, or boost true")
    result = invoke("simulate", *BASE, "--algorithm", "gain.py:Gain", "--algo-opt", "gain=2", "--algo-opt",
                    "boost=true", "--out", "run")
    assert result.exit_code == 0, result.output
