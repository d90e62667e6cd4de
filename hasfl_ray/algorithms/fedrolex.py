"""FedRolex (Alam et al., 2022): p_i = p_i^max, with a window of kept channels that rolls every round."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from hasfl_ray.algorithms.base import Algorithm
from hasfl_ray.algorithms.options import check_count
from hasfl_ray.errors import ConfigError
from hasfl_ray.models import build_model
from hasfl_ray.models.slicing import window_period
from hasfl_ray.registry import register_algorithm

#: The directions the window may roll in: source (FedRolex's code, the default) and forward (hasfl-ray's before).
DIRECTIONS = ("source", "forward")


@dataclass
class FedRolexOptions:
    rolex_step: int = 1  # channels the window advances per round (0: HeteroFL's fixed leading slice)
    rolex_direction: str = "source"  # source: starts at −t·step mod C (FedRolex's torch.roll); forward: +t·step

    def __post_init__(self) -> None:
        check_count("rolex_step", self.rolex_step, 0,
                    "a non-negative integer (channels the window advances per round)")
        if self.rolex_direction not in DIRECTIONS:
            raise ConfigError(f"rolex_direction is {self.rolex_direction!r}; expected source (the window starts at "
                              "channel -t*step mod C, as FedRolex's code rolls it) or forward (at +t*step mod C)")

    def inert(self, config):
        """A window that never moves (rolex_step 0) has no direction to roll in."""
        if self.rolex_step:
            return {}
        return {"rolex_direction": ("rolex_step is 0 (the window never moves)", "rolex_step >= 1")}


@register_algorithm("fedrolex")
class FedRolex(Algorithm):
    """Rolling sub-model extraction.

    Client i keeps ceil(p_i^max · C) channels of every layer like HeteroFL, but the kept channels are
    ``o_t, o_t + 1, …`` modulo C, the same window start for every client of a round and for every layer
    (each modulo its own channel count). With ``rolex_direction: source`` (the default) o_t = −t · ``rolex_step``
    mod C, the window of FedRolex's code (``resnet_server.py::ResnetServerRoll.split_model``:
    ``torch.roll(torch.arange(C), rounds % C, -1)[:ceil(rate · C)]``, ``rounds`` 0 in the first round); with
    ``forward``, o_t = t · ``rolex_step`` (hasfl-ray's window before issue 35). Round t here counts from 0 too. Over
    C / step rounds every channel is trained by every tier, so no coordinate is left at its initialisation even
    when no client has full capacity.

    One integer offset serves every layer: the source window's is (−t · step) mod P, P the least common multiple
    of the model's channel counts (:func:`hasfl_ray.models.slicing.window_period`), read from the run's model
    (``model_name``, which the engine sets before the first round).

    The window travels as ``ClientTask.offset``; the trainer extracts it (``extract_window``) and the
    server aggregates with :func:`hasfl_ray.aggregation.windows.aggregate_windows`, which rolls the
    round's shared window onto the leading slice so the fused kernel does the work.
    """

    options_class = FedRolexOptions
    _period: Optional[int] = None

    def window_offset(self, round: int, client: int) -> int:
        shift = round * self.options.rolex_step
        if self.options.rolex_direction == "forward":
            return shift
        return -shift % self.channel_period()

    def channel_period(self) -> int:
        """The least common multiple of the run's model's channel counts (computed once)."""
        if self._period is None:
            if self.model_name is None:
                raise RuntimeError("FedRolex's source window needs the run's model: set model_name (the engine "
                                   "does before the first round) or use rolex_direction: forward")
            self._period = window_period(build_model(self.model_name).param_specs())
        return self._period
