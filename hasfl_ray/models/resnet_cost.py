"""The ResNets' cost model (:mod:`hasfl_ray.models.resnet`, docs/models.md#costs): the stage plan, the spatial size
at every layer, multiply-accumulates per sample and FLOPs per sample as HeteroFL's own counter counts them.

**HeteroFL's counter** (its repository's ``src/summary.py``, ``summarize`` and ``compute_flops``, unchanged since
commit 96d3f87 of 2020-10-01): one sample through the model in training mode, a forward hook on every module but
the containers and the model itself; a module's FLOPs are computed once and added once per parameter it holds named
``weight`` or ``bias`` (a module with neither adds none). Conv2d: k*k*c_in*c_out*H_out*W_out (+ c_out*H_out*W_out
with a bias; the ResNets' convs have none), added once; affine BatchNorm2d: 2 * the elements of its input, added
twice (weight, bias), so 4 per element; Linear: in * out, added twice (weight, bias); GroupNorm, the Scaler and the
Identity of ``none`` count 0 (``compute_flops`` does not support them), and the ReLUs, the residual sums and the
pool are functional calls, never hooked."""

from __future__ import annotations

from typing import Dict, Iterator, Sequence, Tuple

from hasfl_ray.models.slicing import width_channels

#: The normalisations whose layers HeteroFL's counter counts (nn.BatchNorm2d, affine): 4 FLOPs per element.
COUNTED_NORMS = ("sbn", "bn")


def _sizes(image_size) -> Tuple[int, int]:
    return (image_size, image_size) if isinstance(image_size, int) else (int(image_size[0]), int(image_size[1]))


def _halve(hw: Tuple[int, int], stride: int) -> Tuple[int, int]:
    """Output height and width of a 3x3 pad-1 (or 1x1 pad-0) conv of ``stride``."""
    return tuple((s - 1) // stride + 1 for s in hw)  # type: ignore[return-value]


def _stage_plan(stages: Sequence[int], blocks: Sequence[int]) -> Iterator[Tuple[int, int, int, int, int]]:
    """(stage, block, in channels, out channels, stride) of every basic block, at width 1, ``blocks[i]`` blocks in
    stage i."""
    cin = stages[0]
    for stage, (channels, count) in enumerate(zip(stages, blocks)):
        for block in range(count):
            stride = 2 if stage > 0 and block == 0 else 1
            yield stage, block, cin, channels, stride
            cin = channels


class ResNetCost:
    """The cost model the ResNets share (a mixin of their base class): it reads their ``_layout()``, ``stages``,
    ``blocks``, ``image_size``, ``in_channels``, ``num_classes`` and ``norm``."""

    #: Whether a block's first norm normalises its input (pre-activation) rather than its first conv's output.
    pre_activation = True

    def _positions(self) -> Dict[str, Tuple[int, int]]:
        """Output height and width of every conv, and the spatial size of the activation every norm normalises."""
        hw = _sizes(self.image_size)
        out = {"conv1": hw, "n1": hw}
        for stage, block, _, _, stride in _stage_plan(self.stages, self.blocks):
            prefix, before, hw = f"layer{stage + 1}.{block}", hw, _halve(hw, stride)
            out[f"{prefix}.n1"] = before if self.pre_activation else hw
            out.update({f"{prefix}.{part}": hw for part in ("conv1", "n2", "conv2", "shortcut", "shortcut_norm")})
        out["n4"] = hw
        return out

    def macs(self, p: float) -> int:
        """Multiply-accumulates per sample of the width-p network: every conv (k*k*cin*cout per output position)
        and the linear layer; norms, ReLUs, the residual sums and the pool are not counted (docs/models.md)."""
        return self._count(p, per_normalised=0, classifier_times=1)

    def flops(self, p: float) -> int:
        """FLOPs per sample of the width-p network as HeteroFL's counter counts them (module docstring): the convs'
        multiply-accumulates, 4 per element each BatchNorm normalises (``sbn``, ``bn``; 0 for ``gn`` and ``none``)
        and twice the linear layer's in * out. HeteroFL's published network (``preresnet18-1112``) at level a on
        CIFAR-10: 330,246,144, the authors' 330.2 M; ``preresnet18``: 557,656,064."""
        return self._count(p, per_normalised=4 if self.norm in COUNTED_NORMS else 0, classifier_times=2)

    def _count(self, p: float, per_normalised: int, classifier_times: int) -> int:
        positions = self._positions()
        total = 0
        for name, kind, out, cin, kernel in self._layout():
            c_in = self.in_channels if cin is None else width_channels(p, cin)
            if kind == "conv":
                h, w = positions[name]
                total += width_channels(p, out) * c_in * kernel * kernel * h * w
            elif kind == "norm":
                h, w = positions[name]
                total += per_normalised * width_channels(p, out) * h * w
            else:
                total += classifier_times * c_in * self.num_classes
        return total


__all__ = ["COUNTED_NORMS", "ResNetCost"]
