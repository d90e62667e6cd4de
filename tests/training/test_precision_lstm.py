"""--precision bf16 with an LSTM on a CPU whose oneDNN has no bfloat16 LSTM (it needs AVX-512; an AVX2-only CPU
such as a Zen 3 raises "could not create a primitive descriptor for the LSTM forward propagation primitive" in the
first client's step): refused in one sentence before the run directory is made (exit 2), not a failed round. The
capability probe (hasfl_ray.training.precision.cpu_runs_bf16_lstm) is monkeypatched, so these tests hold on any CPU.
"""

import os

import pytest
import torch

from hasfl_ray.engine import RunConfig
from hasfl_ray.errors import ConfigError
from hasfl_ray.training import precision
from tests.cli.sentences import invoke, refused


@pytest.fixture
def no_bf16_lstm(monkeypatch):
    monkeypatch.setattr(precision, "cpu_runs_bf16_lstm", lambda: False)


def test_bf16_lstm_without_the_cpu_support_is_one_sentence_and_no_run_folder(no_bf16_lstm, shared_data, tmp_path):
    out = tmp_path / "run"
    result = invoke("simulate", "--dataset", "shakespeare", "--data-dir", shared_data, "--precision", "bf16",
                    "--backend", "local", "--clients", 4, "--clients-per-round", 2, "--rounds", 1, "--local-steps", 1,
                    "--out", out, "--quiet")
    refused(result, "precision is 'bf16'", "'shakespeare'", "LSTM", "AVX-512", "expected precision fp32")
    assert not os.path.exists(out)


PLUGIN = """
import torch
from hasfl_ray import Dataset
from hasfl_ray.data.base import TextFederatedDataset


class TinyText(Dataset):
    model = "tiny-lstm"
    model_config = dict(kind="lstm", vocab_size=10, embed_dim=4, hidden=8, layers=1, seq_len=5)
    defaults = dict(rounds=1, local_epochs=1, lr=0.1, clip_norm=10.0, batch_size=4)

    def load(self, config):
        g = torch.Generator().manual_seed(0)
        stream = torch.randint(0, 10, (200,), dtype=torch.uint8, generator=g)
        starts = [torch.randint(0, 190, (8,), generator=g) for _ in range(config.clients)]
        return TextFederatedDataset("tiny", self.model, 10, stream, starts, torch.arange(4),
                                    [f"c{i}" for i in range(config.clients)], 5)
"""


def test_a_plugin_lstm_is_refused_too_and_runs_in_fp32(no_bf16_lstm, tmp_path):
    """No data files needed: a dataset plug-in whose model_config is a small LSTM."""
    (tmp_path / "tiny_text.py").write_text(PLUGIN)
    common = ("simulate", "--dataset", tmp_path / "tiny_text.py:TinyText", "--backend", "local", "--clients", 4,
              "--clients-per-round", 2, "--local-steps", 1, "--quiet")
    result = invoke(*common, "--precision", "bf16", "--out", tmp_path / "bf16")
    refused(result, "precision is 'bf16'", "'tiny-lstm'", "LSTM", "expected precision fp32")
    assert not os.path.exists(tmp_path / "bf16")
    result = invoke(*common, "--out", tmp_path / "fp32")
    assert result.exit_code == 0, result.output
    assert os.path.exists(tmp_path / "fp32" / "summary.json")


def test_the_refusal_names_only_lstm_models_on_a_cpu(no_bf16_lstm):
    with pytest.raises(ConfigError, match=r"^precision is 'bf16' but model 'shakespeare' has an LSTM"):
        precision.check_precision(RunConfig(dataset="shakespeare", precision="bf16", device="cpu"), "shakespeare")
    for config, model in ((RunConfig(dataset="shakespeare", device="cpu"), "shakespeare"),  # fp32
                          (RunConfig(precision="bf16", device="cpu"), "digits"),  # no LSTM
                          (RunConfig(precision="bf16", device="cpu"), "emnist")):
        precision.check_precision(config, model)


def test_a_cpu_with_bf16_lstm_is_not_refused(monkeypatch):
    monkeypatch.setattr(precision, "cpu_runs_bf16_lstm", lambda: True)
    precision.check_precision(RunConfig(dataset="shakespeare", precision="bf16", device="cpu"), "shakespeare")


def test_the_probe_matches_a_real_bf16_lstm_step_and_leaves_the_global_stream_alone():
    precision.cpu_runs_bf16_lstm.cache_clear()
    torch.manual_seed(3)
    before = torch.rand(4)
    torch.manual_seed(3)
    works = precision.cpu_runs_bf16_lstm()
    assert torch.equal(torch.rand(4), before)  # a run's seeded initialisation is not shifted by the probe
    lstm = torch.nn.LSTM(8, 16, num_layers=2, batch_first=True)
    try:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            lstm(torch.zeros(2, 5, 8))
        ran = True
    except RuntimeError:
        ran = False
    assert works == ran
