"""Channel groups of the ResNets for channel index sets (issue 44 item 1a): which index set each scaled dim holds.

A residual network is not a sequential chain: a stage's block outputs, its shortcut and the norms on its stream add
up channel by channel, so every tensor on one stage's residual stream must hold the same channels. The groups:

* ``layer{s}``, the residual stream of stage s: the stem's output (stage 1's stream), every block's ``conv2`` and
  ``shortcut`` outputs, the norms on the stream (a pre-activation block's ``n1`` and the final ``n4``; a
  post-activation network's stem ``n1``, a block's ``n2`` and ``shortcut_norm``), the inputs of the next stage's
  first block (``conv1``, ``shortcut``) and of the classifier;
* ``layer{s}.{b}.conv1``, each block's inner activation: its ``conv1`` output, the norm on it (pre-activation
  ``n2``, post-activation ``n1``) and ``conv2``'s input.

A client then holds one sorted channel list per group (:func:`hasfl_ray.models.index_slicing.index_sets`) and trains
the width-p network on those channels, ceil(p x C) of each, the Scaler and the norms as at width p.
"""

from __future__ import annotations

import re
from typing import Dict, Optional, Tuple

_BLOCK = re.compile(r"layer(\d+)\.(\d+)\.(\w+)$")


def stream_of_input(stage: int, block: int) -> str:
    """The residual stream a block reads: its own stage's after the first block, the stage before's (stage 1: the
    stem's, which is stage 1's stream) for the first."""
    return f"layer{stage}" if block > 0 or stage == 1 else f"layer{stage - 1}"


def resnet_group_labels(name: str, kind: str, pre_activation: bool, stages: int) -> Tuple[Optional[str], ...]:
    """(group of the output dim, group of the input dim) of layout row ``name`` (kind conv, norm or linear); None
    where the dim is not scaled or the row is not the backbone's (an exit's: no groups)."""
    last = f"layer{stages}"
    if name == "conv1":
        return ("layer1", None)
    if name == "n1" and not pre_activation:
        return ("layer1",)
    if name == "n4":
        return (last,)
    if name == "linear":
        return (None, last)
    match = _BLOCK.match(name)
    if match is None:
        return (None, None)
    stage, block, part = int(match.group(1)), int(match.group(2)), match.group(3)
    inner, stream, before = f"layer{stage}.{block}.conv1", f"layer{stage}", stream_of_input(stage, block)
    table: Dict[str, Tuple[Optional[str], ...]] = {
        "conv1": (inner, before), "conv2": (stream, inner), "shortcut": (stream, before), "shortcut_norm": (stream,),
        "n1": (before,) if pre_activation else (inner,), "n2": (inner,) if pre_activation else (stream,)}
    return table.get(part, (None, None))


__all__ = ["resnet_group_labels", "stream_of_input"]
