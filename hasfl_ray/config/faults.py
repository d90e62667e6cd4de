"""Fault-injection specs (``--fault-inject KIND@ROUND``): the kinds there are and how a spec is read."""

from __future__ import annotations

import re
from typing import Optional, Tuple

#: Faults ``--fault-inject KIND@ROUND`` can inject: a killed Ray trainer; a client update poisoned with NaN/Inf
#: (the round's first participant; every backend), which the server must reject; an exception raised inside the
#: trainer of the round's first participant (every backend), which must end the run in one sentence.
FAULT_KINDS = ("kill-trainer", "nan-update", "inf-update", "trainer-error")


def parse_fault(spec: str) -> Optional[Tuple[str, int]]:
    """(kind, round) of a ``KIND@ROUND`` fault-injection spec, or None when it is malformed."""
    match = re.fullmatch(rf"({'|'.join(FAULT_KINDS)})@(\d+)", spec) if isinstance(spec, str) else None
    return (match.group(1), int(match.group(2))) if match else None


def fault_inject_round(spec: str) -> Optional[int]:
    """The round of a ``kill-trainer@ROUND`` fault-injection spec, or None for any other spec."""
    fault = parse_fault(spec)
    return fault[1] if fault is not None and fault[0] == "kill-trainer" else None
