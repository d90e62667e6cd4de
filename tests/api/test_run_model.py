"""``load_run(path).model(width)`` is the network the run scored at that width (docs/notebook.md): evaluated on the
test set it gives exactly the run's recorded ``accuracy_at_width`` (width 1: ``test_accuracy``), for the nested
prefix (HAS-FL), FIARSE's and FedGMR's masked models, DepthFL's ensemble and exits, ScaleFL's and a width_depth
run's (width, depth) shapes. Before, every run got the nested prefix: a FIARSE run's width-0.25 model scored 10.9 %
against the 25.9 % its metrics recorded (h56)."""

import pytest

import hasfl_ray
from hasfl_ray.config import RunConfig
from hasfl_ray.data import load_plugin_dataset
from hasfl_ray.registry import lookup
from hasfl_ray.training.evaluate import evaluate

SMALL = dict(backend="local", rounds=2, clients=6, clients_per_round=3, seed=42, progress=False)


@pytest.mark.parametrize("algorithm, extra", [
    ("hasfl", {}),
    ("fiarse", {}),
    ("fedgmr", {}),
    ("depthfl", {}),
    ("scalefl", {}),
    ("heterofl", {"sub_model": "width_depth"}),
])
def test_the_model_at_each_width_scores_what_the_run_recorded(tmp_path, algorithm, extra):
    out = str(tmp_path / algorithm)
    hasfl_ray.simulate(algorithm=algorithm, out_dir=out, **SMALL, **extra)
    run = hasfl_ray.load_run(out)
    config = RunConfig.from_dict(run.config).resolved()
    dataset = load_plugin_dataset(lookup("dataset", config.dataset), config)
    recorded = run.history[-1]["accuracy_at_width"]
    assert len(recorded) > 1 and recorded["1"] == run.history[-1]["test_accuracy"]
    got = {key: evaluate(run.model(float(key)), dataset, config.eval_batch_size)[0] for key in recorded}
    assert got == recorded
