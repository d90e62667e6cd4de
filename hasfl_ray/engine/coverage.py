"""The coverage monitor: a run whose global model keeps coordinates at w^(0) after warm-up is flagged.

Proposition 1 of the paper: when every allocation stays below some p̄ < 1, the coordinates outside the leading p̄
slice are never trained and keep their initial value. The round loop records that as ``frozen_fraction``; this
module reads it off the metrics lines (so a resumed run and ``report`` on an old run see the same verdict). Where a
line has ``frozen_by_layer`` (runs written since it exists), the warning names the layers that stay frozen.
"""

from __future__ import annotations

from typing import Any, Dict, Mapping, Optional, Sequence, Tuple

#: Rounds after warm-up that frozen_fraction must stay above :data:`NEGLIGIBLE` before the run's log warns (once).
WARN_AFTER_ROUNDS = 5
#: A frozen fraction at or below this is not a coverage problem: a handful of coordinates whose every update is
#: exactly zero or rounds away in float32 (2 of the CIFAR-10 CNN's 3.25 million, 6e-7, in a HAS-FL run with the
#: coverage guarantee on). A coordinate no participant covers freezes whole channels: Uniform's 0.74.
NEGLIGIBLE = 1e-4

#: How many of the frozen layers the log's warning names (largest frozen fraction first); summary.json has them all.
NAMED_LAYERS = 5

CAUSE = ("no participant covered those coordinates: every allocation stayed below full width, so they keep their "
         "initial value w^(0) (Proposition 1)")


def streak_step(start: Optional[int], line: Mapping[str, Any]) -> Optional[int]:
    """:func:`frozen_streak_start` of the lines so far (``start``) and one more, ``line``."""
    if (line.get("frozen_fraction") or 0.0) > NEGLIGIBLE:
        return line["round"] if start is None else start
    return None


def frozen_streak_start(history: Sequence[Mapping[str, Any]]) -> Optional[int]:
    """The round from which frozen_fraction has been above :data:`NEGLIGIBLE` in every line up to the last, or None."""
    start = None
    for line in history:
        start = streak_step(start, line)
    return start


def streak_after(history: Sequence[Mapping[str, Any]], counted: int, start: Optional[int]) -> Tuple[int, Optional[int]]:
    """(len(history), frozen_streak_start(history)) from those of its first ``counted`` lines: only the lines since
    are read (a run's recorder keeps the pair, so a round does not read back the whole history)."""
    if counted > len(history):  # another history since: read it all
        counted, start = 0, None
    for line in history[counted:]:
        start = streak_step(start, line)
    return len(history), start


def warns(start: Optional[int], last_round: int, warmup: int) -> bool:
    """:func:`should_warn` from the streak's start and the last line's round."""
    return start is not None and last_round - max(start, warmup) + 1 == WARN_AFTER_ROUNDS


def frozen_layers(line: Mapping[str, Any]) -> Optional[Dict[str, float]]:
    """The parameters of a metrics line whose ``frozen_by_layer`` fraction is above :data:`NEGLIGIBLE`, largest
    first (ties in the model's order): {name: fraction}; None for a line without it (written before it existed)."""
    by_layer = line.get("frozen_by_layer")
    if not isinstance(by_layer, Mapping):
        return None
    return dict(sorted(((name, f) for name, f in by_layer.items() if f > NEGLIGIBLE), key=lambda item: -item[1]))


def frozen_layers_phrase(line: Mapping[str, Any]) -> str:
    """The log warning's naming of the frozen layers, e.g. `` (fc1.weight 80.0 %, conv2.weight 74.0 %)``, at most
    :data:`NAMED_LAYERS` and how many more; empty for a line without ``frozen_by_layer``."""
    layers = frozen_layers(line)
    if not layers:
        return ""
    named = [f"{name} {100 * fraction:.1f} %" for name, fraction in list(layers.items())[:NAMED_LAYERS]]
    more = len(layers) - len(named)
    return f" ({', '.join(named)}{f' and {more} more layers' if more else ''})"


def should_warn(history: Sequence[Mapping[str, Any]], warmup: int) -> bool:
    """True at the round where the log warns: frozen_fraction above :data:`NEGLIGIBLE` for :data:`WARN_AFTER_ROUNDS`
    rounds in a row after warm-up (the one round of the run where this holds first)."""
    return bool(history) and warns(frozen_streak_start(history), history[-1]["round"], warmup)


def coverage_warning(history: Sequence[Mapping[str, Any]], warmup: int) -> Optional[Dict[str, Any]]:
    """summary.json's ``coverage_warning`` block when frozen_fraction stayed above :data:`NEGLIGIBLE` from some round
    to the end, for
    at least :data:`WARN_AFTER_ROUNDS` rounds after warm-up (the rule of the log's warning; a fraction that is above
    0 for a round or two, a few coordinates whose update rounded away, is not a coverage problem): the last
    fraction, the first round of the streak, the cause and (when the last line records them) ``frozen_layers``,
    :func:`frozen_layers` of the last line; else None."""
    start = frozen_streak_start(history)
    if start is None:
        return None
    rounds = history[-1]["round"] - max(start, warmup) + 1
    if rounds < WARN_AFTER_ROUNDS:
        return None
    block = {"frozen_fraction": history[-1]["frozen_fraction"], "first_round": start, "post_warmup_rounds": rounds,
             "cause": CAUSE}
    layers = frozen_layers(history[-1])
    if layers is not None:
        block["frozen_layers"] = layers
    return block
