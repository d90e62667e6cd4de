"""What a user sees at the end of a run (issue 37 item 10): ``simulate`` ends with a short readable summary (final
and best accuracy, accuracy at each evaluated width, local mean and worst, simulated time and bytes where clocked,
params_sha256, the run directory), not the whole summary.json; ``--json`` prints summary.json itself, strict JSON."""

import json

from click.testing import CliRunner

from hasfl_ray.cli.main import main
from hasfl_ray.cli.summary import readable_summary

ARGS = ["simulate", "--backend", "local", "--rounds", "2", "--quiet"]


def test_simulate_ends_with_a_readable_summary_of_its_summary_json(tmp_path):
    out = tmp_path / "run"
    result = CliRunner().invoke(main, [*ARGS, "--out", str(out)])
    assert result.exit_code == 0, result.output
    summary = json.loads((out / "summary.json").read_text())
    text = result.output
    assert "{" not in text and len(text.splitlines()) <= 10  # not the JSON: a few lines
    assert text.splitlines()[0] == (f"hasfl on digits, seed 42: 2 rounds in {summary['wall_s']:.1f} s "
                                    f"(+{summary['startup_s']:.1f} s start-up)")  # the start-up apart
    assert f"final {100 * summary['final_accuracy']:.2f} %, best {100 * summary['best_accuracy']:.2f} %" in text
    assert (f"loss            test {summary['final_test_loss']:.4f}, training {summary['final_train_loss']:.4f} "
            "(final round)\n") in text
    widths = ", ".join(f"p={w} {100 * a:.2f} %" for w, a in summary["accuracy_at_width_final"].items())
    assert f"at each width   {widths} (final)" in text
    local = summary["local_accuracy"]
    assert f"local accuracy  mean {100 * local['mean']:.2f} %, worst {100 * local['worst']:.2f} % over 20 clients" \
        in text
    assert f"params_sha256   {summary['params_sha256']}\n" in text and f"run directory   {out}\n" in text
    assert "simulated" not in text  # no clock: no simulated time


def test_json_prints_summary_json_itself(tmp_path):
    out = tmp_path / "run"
    result = CliRunner().invoke(main, [*ARGS, "--devices", "lognormal", "--out", str(out), "--json"])
    assert result.exit_code == 0, result.output
    assert result.output == (out / "summary.json").read_text()
    json.loads(result.output, parse_constant=lambda name: (_ for _ in ()).throw(ValueError(name)))  # strict


def test_a_clocked_run_shows_simulated_time_and_bytes_and_text_blocks_their_reason():
    summary = {"final_accuracy": 0.5, "best_accuracy": 0.6, "rounds": 3, "params_sha256": "ab", "wall_s": 1.0,
               "accuracy_at_width_final": {"1": 0.5}, "local_accuracy": "not defined for this dataset: a text ...",
               "sim_hours": 2.5, "sim_gb": 1.5, "sim_gb_down": 1.0, "sim_gb_up": 0.5, "late_updates": 4,
               "dropped_updates": 0, "partial_updates": 1, "sim_extra": None}
    text = readable_summary(summary, "runs/x", "fedavg", "shakespeare", 7)
    assert "simulated time  2.5 h; 1.5 GB moved (1 GB down, 500 MB up); updates 4 late, 1 partial" in text
    assert "local accuracy  not defined for this dataset\n" in text
    assert "at each width" not in text  # one width only: the accuracy line says it
    infinite = readable_summary({**summary, "sim_hours": None, "sim_gb": 0.0004}, "runs/x", "fedavg", "d", 7)
    assert "simulated time  n/a; 400 kB moved" in infinite


def test_an_asynchronous_run_counts_server_updates_not_rounds():
    summary = {"final_accuracy": 0.5, "best_accuracy": 0.6, "rounds": 5, "params_sha256": "ab", "wall_s": 1.0,
               "accuracy_at_width_final": {"1": 0.5}, "mode": "async", "async_rule": "fedbuff", "server_updates": 5,
               "staleness_mean": 0.45, "staleness_max": 2, "sim_hours": 0.001, "sim_gb": 0.002, "sim_gb_down": 0.001,
               "sim_gb_up": 0.001}
    head = readable_summary(summary, "runs/x", "hasfl", "digits", 42).splitlines()[0]
    assert head == "hasfl on digits, seed 42: 5 server updates (fedbuff, staleness mean 0.45, max 2) in 1.0 s"


def test_a_bf16_run_and_an_early_stop_say_so(tmp_path):
    # h52: a bf16 run's summary read as an fp32 run's (config.yaml only held the precision), and a run dp_epsilon
    # ended after 2 of 20 rounds said "2 rounds" with no word of why
    out = tmp_path / "run"
    result = CliRunner().invoke(main, ["simulate", "--backend", "local", "--rounds", "20", "--clients", "6",
                                       "--clients-per-round", "3", "--precision", "bf16", "--dp-noise-multiplier",
                                       "1", "--dp-epsilon", "10", "--local-eval-clients", "off", "--quiet",
                                       "--out", str(out)])
    assert result.exit_code == 0, result.output
    summary = json.loads((out / "summary.json").read_text())
    lines = result.output.splitlines()
    assert lines[0].startswith("hasfl on digits, seed 42, bf16 autocast: 2 rounds in ")
    assert f"  stopped early   after round 2: {summary['stopped_early']['reason']}" in lines
    fp32 = readable_summary({**summary, "stopped_early": None}, "runs/x", "hasfl", "digits", 42, "fp32")
    assert fp32.splitlines()[0].startswith("hasfl on digits, seed 42: 2 rounds") and "stopped early" not in fp32
