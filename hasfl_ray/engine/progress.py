"""What a run shows while it runs (issue 45 item 5): a tqdm bar over the rounds (or an asynchronous run's server
updates) on a terminal, and one log line per round where the bar's stream is not a terminal (a job scheduler's log,
a pipe), in place of tqdm's ``\\r``-joined frames; and the start-up time (data, model, Ray) apart from the rounds'.
"""

from __future__ import annotations

import sys
import time
from typing import Any, Dict, Optional, TextIO


def is_terminal(stream: TextIO) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # a closed or replaced stream
        return False


def open_bar(engine: Any, unit: str = "round", stream: Optional[TextIO] = None) -> Any:
    """The run's progress display when ``engine.progress`` (else None): a tqdm bar of ``config.rounds`` ``unit`` s
    on a terminal, a :class:`LineProgress` elsewhere. Both take ``set_postfix``, ``update`` and ``close``."""
    if not engine.progress:
        return None
    from hasfl_ray.registry import spec_label
    c = engine.config
    stream = sys.stderr if stream is None else stream
    desc = f"{spec_label(c.algorithm)} on {spec_label(c.dataset)}"
    if not is_terminal(stream):
        return LineProgress(c.rounds, len(engine.history), unit, desc, stream)
    from tqdm import tqdm
    return tqdm(total=c.rounds, desc=desc, unit=unit, dynamic_ncols=True, initial=len(engine.history), file=stream)


def show_line(bar: Any, line: Dict[str, Any]) -> None:
    """A recorded line on the bar: its accuracy, width, coverage and training loss (an asynchronous line between
    evaluations has no accuracy: the bar keeps the last), then one more step."""
    if line.get("test_accuracy") is not None:
        postfix = dict(acc=f"{line['test_accuracy']:.3f}", avg_p=f"{line['avg_p']:.2f}", cov=f"{line['coverage']:.2f}")
        if line.get("train_loss") is not None:
            postfix["loss"] = f"{line['train_loss']:.3f}"
        bar.set_postfix(**postfix)
    bar.update(1)


def _seconds(s: float) -> str:
    return f"{s:.1f} s" if s < 60 else f"{s / 60:.1f} min" if s < 3600 else f"{s / 3600:.1f} h"


class LineProgress:
    """One line per ``update``: ``hasfl on digits: round 3/20, acc=0.512 avg_p=0.50 cov=1.00 (4.2 s, ~24 s
    left)`` (the estimate from this start's pace), flushed, so a log read while the run runs is current."""

    def __init__(self, total: int, done: int, unit: str, desc: str, stream: TextIO):
        self.total, self.n, self.unit, self.desc, self.stream = total, done, unit, desc, stream
        self.first, self.start, self.postfix = done, time.perf_counter(), ""

    def __bool__(self) -> bool:
        return True

    def set_postfix(self, **values: Any) -> None:
        self.postfix = " ".join(f"{k}={v}" for k, v in values.items())

    def update(self, n: int = 1) -> None:
        self.n += n
        elapsed = time.perf_counter() - self.start
        done = self.n - self.first
        left = f", ~{_seconds(elapsed / done * (self.total - self.n))} left" if 0 < done and self.n < self.total else ""
        text = f"{self.desc}: {self.unit} {self.n}/{self.total}" + (f", {self.postfix}" if self.postfix else "")
        self.stream.write(f"{text} ({_seconds(elapsed)}{left})\n")
        self.stream.flush()

    def close(self) -> None:
        pass


def mark_run_start(engine: Any) -> None:
    """Engine.run began: the start-up counted from here (from prepare's start when prepare ran before run)."""
    engine._run_start = time.perf_counter() - (getattr(engine, "prepare_s", 0.0) if engine.prepared else 0.0)


def startup_seconds(engine: Any) -> Optional[float]:
    """summary.json's ``startup_s``: from this start's prepare (or run) to its first round (data, model, Ray)."""
    run_start, loop_start = getattr(engine, "_run_start", None), getattr(engine, "_loop_start", None)
    if run_start is None or not loop_start:
        return None
    return max(loop_start - run_start, 0.0)
