"""FedRolex (Alam et al., 2022): p_i = p_i^max, with a window of kept channels that rolls every round."""

from __future__ import annotations

from dataclasses import dataclass

from hasfl_ray.algorithms.base import Algorithm
from hasfl_ray.algorithms.options import check_count
from hasfl_ray.registry import register_algorithm


@dataclass
class FedRolexOptions:
    rolex_step: int = 1  # channels the window advances per round (0: HeteroFL's fixed leading slice)

    def __post_init__(self) -> None:
        check_count("rolex_step", self.rolex_step, 0,
                    "a non-negative integer (channels the window advances per round)")


@register_algorithm("fedrolex")
class FedRolex(Algorithm):
    """Rolling sub-model extraction.

    Client i keeps ceil(p_i^max · C) channels of every layer like HeteroFL, but the kept channels are
    ``o_t, o_t + 1, …`` modulo C with o_t = t · ``rolex_step`` (the paper's window, which starts at
    channel t mod C in round t), the same window start for every client of a round and for every layer
    (each modulo its own channel count). Over C / step rounds every channel is trained by every tier, so
    no coordinate is left at its initialisation even when no client has full capacity.

    The window travels as ``ClientTask.offset``; the trainer extracts it (``extract_window``) and the
    server aggregates with :func:`hasfl_ray.aggregation.windows.aggregate_windows`, which rolls the
    round's shared window onto the leading slice so the fused kernel does the work.
    """

    options_class = FedRolexOptions

    def window_offset(self, round: int, client: int) -> int:
        return round * self.options.rolex_step
