"""A plug-in whose `sub_model` gives a client another width than its allocation (docs/plugins.md) and which hands
out channel sets or masks: every method that describes the client's sub-model is asked at the width the client
trains, the one `sub_model` returned, so the channel counts fit the trained network and the device clock prices the
very masks the client trains (issue 44 item 1, h62's battery)."""

import json

import torch
from click.testing import CliRunner

from hasfl_ray.cli.main import main

TINY = ["--rounds", "2", "--clients", "6", "--clients-per-round", "3", "--quiet", "--dataset", "digits",
        "--backend", "local"]
PLUGIN = '''
import torch
from hasfl_ray import Algorithm
from hasfl_ray.models import build_model
from hasfl_ray.models.index_slicing import random_channel_sets
from hasfl_ray.training.seeding import torch_generator

ASKED = []


class Narrower(Algorithm):
    """Every client trains a quarter of the network, whatever it was allocated."""

    def sub_model(self, round, client, width):
        return 0.25, None


class Channels(Narrower):
    def channel_sets(self, round, client, width):
        ASKED.append((round, client, width))
        specs = build_model(self.model_name).param_specs()
        return random_channel_sets(specs, width, torch_generator(self.config.seed, 5, round, client))


class Masks(Narrower):
    def parameter_masks(self, round, client, width):
        ASKED.append((round, client, width))
        generator = torch_generator(self.config.seed, 6, round, client)
        return {"fc1.weight": torch.rand(128, 256, generator=generator) < width}
'''


def plugin(tmp_path):
    path = tmp_path / "narrower.py"
    path.write_text(PLUGIN)
    return str(path)


def test_channel_sets_are_asked_at_the_width_sub_model_gives(tmp_path):
    """Before: the task asked `channel_sets` at the allocation (0.5: 16 of 32 channels) while the client trained the
    width-0.25 network; the trainer refused the sets and the run ended in 'training client 1 of round 0 failed',
    exit 1."""
    out = tmp_path / "run"
    result = CliRunner().invoke(main, ["simulate", *TINY, "--algorithm", f"{plugin(tmp_path)}:Channels",
                                       "--out", str(out)])
    assert result.exit_code == 0, result.output
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(lines) == 2 and 0 < lines[-1]["coverage"] < 1


def test_the_clock_prices_the_masks_the_client_trains(tmp_path):
    """Before: with a device population, the clock asked `parameter_masks` at the sub-model's width (0.25) and the task
    at the allocation (0.5): two different masks a client and round, the time and bytes priced for masks the client
    never trained."""
    import importlib.util

    import hasfl_ray

    spec = importlib.util.spec_from_file_location("narrower_masks", plugin(tmp_path))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    hasfl_ray.simulate(algorithm=module.Masks, dataset="digits", rounds=2, clients=6, clients_per_round=3,
                       backend="local", devices="lognormal", out_dir=str(tmp_path / "run"))
    widths = {}
    for round, client, width in module.ASKED:
        widths.setdefault((round, client), set()).add(width)
    # one width a client and round, the trained one: the clock and the task read the same (memoised) masks
    assert len(widths) == 6 and all(seen == {0.25} for seen in widths.values()), widths
