"""A plug-in that hands each client an unstructured parameter mask instead of the leading slice (FIARSE-style
sub-models, issue 44 item 1b): every client holds a random fraction p of each weight matrix's and kernel's
coordinates (biases and norms whole), trains the full-shape network with w ⊙ m, and its update travels as the held
values plus a bitmask that the fused kernel aggregates.

    hasfl-ray simulate --algorithm examples/mask_policy.py:RandomMasks --dataset digits
"""

import torch

from hasfl_ray import Algorithm
from hasfl_ray.models import build_model
from hasfl_ray.training.seeding import torch_generator

STREAM_MASKS = 102  # this plug-in's own seeding stream (keyed by round and client below)


class RandomMasks(Algorithm):
    """Every client holds a random fraction p (its width) of every weight's coordinates, drawn afresh each round."""

    def parameter_masks(self, round, client, width):
        generator = torch_generator(self.config.seed, STREAM_MASKS, round, client)
        masks = {}
        for name, spec in build_model(self.model_name).param_specs().items():
            if name.endswith("weight") and len(spec.shape) > 1:  # weight matrices and kernels
                masks[name] = torch.rand(spec.shape, generator=generator) < width
        return masks
