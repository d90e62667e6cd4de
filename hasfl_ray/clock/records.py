"""What a clocked run records (docs/clock.md, "Records"): the clock's keys of a metrics.jsonl line and of
summary.json. A run without a device population records none of them."""

from __future__ import annotations

from collections import Counter
from typing import Any, Dict, Sequence

import numpy as np

from hasfl_ray.clock.clock import Invitation, RoundOutcome

#: The test accuracies whose time-to-accuracy summary.json reports (simulated seconds at which test_accuracy first
#: reached each, or "not reached").
ACCURACY_TARGETS = (0.5, 0.8, 0.9, 0.95)

NOT_REACHED = "not reached"


def width_label(width: float) -> str:
    """A width as metrics.jsonl's keys write it ("0.25", "1"), as accuracy_at_width does."""
    return format(float(width), "g")


def round_record(invitation: Invitation, outcome: RoundOutcome, sim_time: float,
                 tiers: Sequence[float]) -> Dict[str, Any]:
    """The clock's keys of one metrics line: ``sim_time_s`` (simulated seconds at the round's end, since the run's
    start), ``round_time_s``, ``idle_s`` (waiting for an available client before it), ``bytes_down``, ``bytes_up``,
    ``invited``, ``late_updates``, ``dropped_updates``, ``partial_updates``, ``unavailable_clients`` (candidates
    found unavailable while inviting) and ``participants_by_tier`` (kept participants per p^max; ``tiers``: their
    p^max, in kept order)."""
    counts = Counter(width_label(w) for w in tiers)
    return {"sim_time_s": sim_time, "round_time_s": outcome.round_time, "idle_s": invitation.idle_s,
            "bytes_down": outcome.bytes_down, "bytes_up": outcome.bytes_up, "invited": len(invitation.clients),
            "late_updates": len(outcome.late), "dropped_updates": len(outcome.dropped),
            "partial_updates": len(outcome.steps), "unavailable_clients": invitation.unavailable,
            "participants_by_tier": {key: counts[key] for key in sorted(counts, key=float)}}


def clock_summary(history: Sequence[Dict[str, Any]]) -> Dict[str, Any]:
    """summary.json's clock keys from the metrics lines: simulated hours and GB in all (down, up and both), the late,
    dropped and partial updates in all, and ``time_to_accuracy_s``: for each of :data:`ACCURACY_TARGETS`, the
    ``sim_time_s`` of the first round whose test_accuracy reached it, or "not reached"."""
    down = sum(line["bytes_down"] for line in history)
    up = sum(line["bytes_up"] for line in history)
    reached: Dict[str, Any] = {}
    for target in ACCURACY_TARGETS:
        first = next((line["sim_time_s"] for line in history
                      if line["test_accuracy"] is not None and line["test_accuracy"] >= target), None)
        reached[width_label(target)] = NOT_REACHED if first is None else first
    sim_time = history[-1]["sim_time_s"] if history else 0.0
    return {"sim_hours": sim_time / 3600.0, "sim_gb": (down + up) / 1e9, "sim_gb_down": down / 1e9,
            "sim_gb_up": up / 1e9, "late_updates": sum(line["late_updates"] for line in history),
            "dropped_updates": sum(line["dropped_updates"] for line in history),
            "partial_updates": sum(line["partial_updates"] for line in history),
            "time_to_accuracy_s": reached}


def profile_columns(clock) -> Dict[str, np.ndarray]:
    """clients.csv's clock columns, name -> (num_clients,) array: the device, then wait_share (NaN: never took
    part)."""
    p = clock.profiles
    return {"speed_macs_per_s": p.speed, "down_bytes_per_s": p.down, "up_bytes_per_s": p.up,
            "latency_s": p.latency, "wait_share": clock.wait_shares()}
