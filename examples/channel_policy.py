"""A plug-in that hands each client a random set of channels of every layer instead of the leading slice
(FLuID-style sub-models, issue 44 item 1a): the client trains the width-p network on exactly those channels, the
next layer's inputs follow, and its update travels as index sets the fused kernel aggregates.

    hasfl-ray simulate --algorithm examples/channel_policy.py:RandomChannels --dataset digits

For the CNNs, the MLP and the ResNets (one set per stage's residual stream and per block's inner activation,
docs/models.md#channel-index-sets). With a device population each client's index lists are priced both ways
(``Algorithm.client_cost``'s default, docs/clock.md).
"""

from hasfl_ray import Algorithm
from hasfl_ray.models import build_model
from hasfl_ray.models.index_slicing import random_channel_sets
from hasfl_ray.training.seeding import torch_generator

STREAM_CHANNELS = 101  # this plug-in's own seeding stream (keyed by round and client below)


class RandomChannels(Algorithm):
    """Every client trains ceil(p x C) channels of every layer, drawn afresh each round, at its width p."""

    def channel_sets(self, round, client, width):
        specs = build_model(self.model_name).param_specs()
        generator = torch_generator(self.config.seed, STREAM_CHANNELS, round, client)
        return random_channel_sets(specs, width, generator)
