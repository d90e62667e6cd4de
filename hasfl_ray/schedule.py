"""The protocol's schedules: the adaptation schedule (``warmup``, ``t_adapt``: when HAS-FL and random-budget adapt, the
first round trained with adapted widths, the post-warm-up mean width the engine reports, ``avg_p_post_warmup``) and
the learning rate of each round (``lr_decay``, ``lr_milestones``, ``lr_gamma``).

It sits at the bottom of the package beside the run configuration and imports nothing of hasfl_ray: the engine and
the algorithms both read it, so neither has to import the other for it.
"""

from __future__ import annotations

from bisect import bisect_right
from typing import Optional, Sequence

import numpy as np


def is_adaptation_round(round: int, warmup: int, t_adapt: int) -> bool:
    """HAS-FL's schedule, shared by random-budget: adapt at the end of round t when t >= warmup and t % t_adapt == 0."""
    return round >= warmup and round % t_adapt == 0


def first_adapted_round(warmup: int, t_adapt: int) -> int:
    """The first round trained with adapted widths: one after HAS-FL's first adaptation (the smallest t ≥ warmup
    with t % t_adapt == 0; its block runs at the end of round t). Rounds before it train at p^max."""
    first_adaptation = -(-warmup // t_adapt) * t_adapt
    return first_adaptation + 1


def post_warmup_avg_p(avg_p_per_round: Sequence[float], warmup: int, t_adapt: int) -> Optional[float]:
    """Mean of the per-round avg_p over the rounds from :func:`first_adapted_round` on (None when there are none):
    the figure HAS-FL and random-budget are matched on, since both train at p^max before it."""
    adapted = list(avg_p_per_round)[first_adapted_round(warmup, t_adapt):]
    return float(np.mean(adapted)) if adapted else None


def round_lr(lr: float, decay: float, round: int, milestones: Optional[Sequence[int]] = None,
             gamma: float = 0.1) -> float:
    """The local learning rate of round ``round`` (0-based): ``lr`` x ``decay``^round, times ``gamma`` for every
    milestone at or before the round (a step schedule: PyTorch's MultiStepLR stepped once after each round, as
    HeteroFL steps its; ``lr_milestones`` [150, 250] trains rounds 0-149 at lr, 150-249 at lr x gamma, then lr x
    gamma^2). A source that steps its scheduler before each round (FedRolex's main_resnet.py) decays from its
    milestone M's round, 0-based M - 1: its milestones are M - 1 here (the FedRolex pack's [1199])."""
    value = lr * decay ** round
    if milestones:
        value *= gamma ** bisect_right(sorted(milestones), round)
    return value


def milestones_note(milestones: Optional[Sequence[int]], rounds: int) -> Optional[str]:
    """The warning line a run gives at its start when an ``lr_milestones`` entry is at or past its last round (0-based
    ``rounds`` - 1): :func:`round_lr` never reaches it, so the rate never drops there (a pack's protocol run for
    fewer rounds than its source's, say). None when every milestone falls inside the run, or there are none."""
    late = sorted(m for m in milestones or () if m >= rounds)
    if not milestones or not late or not isinstance(rounds, int) or rounds < 1:
        return None
    named = ", ".join(str(m) for m in late)
    return (f"lr_milestones {list(milestones)!r} has {named} at or past the run's last round ({rounds} round"
            f"{'' if rounds == 1 else 's'}: 0 to {rounds - 1}), so the learning rate never drops there; expected "
            f"milestones below rounds ({rounds}) for a drop within the run")


__all__ = ["first_adapted_round", "is_adaptation_round", "milestones_note", "post_warmup_avg_p", "round_lr"]
