"""``classifier_aggregation: label_split`` in the server and in a run: only the output layer changes (its rows of the
labels no participant holds keep their value), a classes:2 run differs from the default, bad values are one
sentence with exit status 2, and the HeteroFL and FedRolex packs turn it on (the source rule itself is checked in
tests/aggregation/test_label_split.py against HeteroFL's src/fed.py)."""

import numpy as np
import pytest
import torch
import yaml
from click.testing import CliRunner

from hasfl_ray.aggregation.label_split import client_label_masks
from hasfl_ray.cli.main import main
from hasfl_ray.data.digits import load_digits_federated
from hasfl_ray.engine import Engine, RunConfig
from hasfl_ray.engine.server import Server
from hasfl_ray.errors import ConfigError
from hasfl_ray.engine.participants import initial_parameters
from hasfl_ray.models import build_model
from hasfl_ray.training.result import ClientResult

RUN = dict(dataset="digits", partition="classes:2", clients=10, clients_per_round=5, rounds=2, seed=3,
           algorithm="heterofl", algorithm_options={"heterofl_weighting": "count"}, backend="local", device="cpu",
           checkpoint_every=0)


def test_the_server_changes_only_the_output_layer_and_keeps_rows_no_participant_holds():
    dataset = load_digits_federated(10, 0.3, 3, partition="classes:2")
    masks = client_label_masks(dataset)
    params = initial_parameters("digits", 0)
    specs = build_model("digits").param_specs()
    generator = torch.Generator().manual_seed(1)
    clients, widths = [0, 1, 2], [1.0, 0.5, 0.25]
    results = [ClientResult(c, w, {n: torch.randn(s.sliced_shape(w), generator=generator) for n, s in specs.items()},
                            10, 0.5, 1) for c, w in zip(clients, widths)]
    plain = Server("digits", params, dataset, 500, "auto", "cpu")
    split = Server("digits", params, dataset, 500, "auto", "cpu", label_masks=masks)
    _, plain_stats = plain.apply(results, [1.0] * 3)
    _, split_stats = split.apply(results, [1.0] * 3)
    assert split.output_layer == ("fc2.weight", "fc2.bias")
    for name in specs:
        assert torch.equal(plain.params[name], split.params[name]) == (name not in split.output_layer), name
    held = masks[clients].any(axis=0)
    assert not held.all()  # three clients of two labels each: some label unheld
    for k in np.flatnonzero(~held):
        assert torch.equal(split.params["fc2.weight"][k], params["fc2.weight"][k])
        assert split.params["fc2.bias"][k] == params["fc2.bias"][k]
    for k in np.flatnonzero(held):  # the bias row: the mean over the label's holders (count weights)
        holders = [i for i, c in enumerate(clients) if masks[c, k]]
        expected = params["fc2.bias"][k] + sum(results[i].update["fc2.bias"][k] for i in holders) / len(holders)
        assert float(split.params["fc2.bias"][k]) == pytest.approx(float(expected), rel=1e-6)
    assert split_stats.covered_by_layer["fc2.bias"] == pytest.approx(held.mean())
    assert plain_stats.covered_by_layer["fc2.bias"] == 1.0
    assert torch.isfinite(split_stats.div_num).all() and torch.isfinite(split_stats.div_den).all()


def test_a_classes_2_run_with_label_split_differs_from_the_default(tmp_path):
    off = Engine(RunConfig(**RUN), out_dir=str(tmp_path / "off")).run()
    on = Engine(RunConfig(**RUN, classifier_aggregation="label_split"), out_dir=str(tmp_path / "on")).run()
    assert on["params_sha256"] != off["params_sha256"]
    stored = yaml.safe_load((tmp_path / "on" / "config.yaml").read_text())
    assert stored["classifier_aggregation"] == "label_split"


def test_a_bad_value_is_one_sentence_with_exit_status_2(tmp_path, monkeypatch):
    with pytest.raises(ConfigError, match=r"^classifier_aggregation is 'heterofl'; expected all or label_split$"):
        RunConfig(backend="local", classifier_aggregation="heterofl")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "bad.yaml").write_text("classifier_aggregation: heterofl\n")
    for args in (["--classifier-aggregation", "rows"], ["--config", "bad.yaml"]):
        result = CliRunner().invoke(main, ["simulate", *args, "--backend", "local", "--quiet", "--out", "run"])
        message = result.output.strip()
        assert result.exit_code == 2 and len(message.splitlines()) == 1 and message.startswith("Error: "), message
        assert "classifier" in message and "label_split" in message, message
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.yaml"]


def test_the_heterofl_and_fedrolex_packs_aggregate_the_classifier_by_label_split():
    for pack in ("configs/pack-heterofl-cifar10.yaml", "configs/pack-fedrolex-cifar10.yaml"):
        with open(pack, encoding="utf-8") as handle:
            assert yaml.safe_load(handle)["classifier_aggregation"] == "label_split", pack
