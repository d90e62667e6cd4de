"""A run's metrics lines, kept compactly (issue 46 item 4): a long run's memory does not grow by its history.

Every round appends its metrics line to ``Engine.history`` (checkpoints, the summary, the coverage warning and
callbacks read it). As dicts of Python numbers an EMNIST line held about 8 KB in dozens of small objects that pin the
allocator's pages (4 MiB over 500 rounds, a part of the driver's creep; oneDNN's primitive cache was the larger,
hasfl_ray/allocator.py). :class:`History` keeps each line but the last pickled (one block of about 1.7 KB), and the last as it is, so the round being recorded can still be
completed in place (:func:`~hasfl_ray.engine.evaluating.settle_owed_local`). Everything is kept, as it was: reading
a line gives back an equal dict (a copy for every line but the last); metrics.jsonl holds the same lines on disk.
"""

from __future__ import annotations

import pickle
from collections.abc import Sequence
from typing import Any, Dict, Iterable, Iterator, List, Optional, Union


class History(Sequence):
    """The metrics lines of the rounds recorded so far, oldest first (a read-only sequence of dicts plus
    :meth:`append`)."""

    def __init__(self, lines: Iterable[Dict[str, Any]] = ()):
        self._packed: List[bytes] = []
        self._last: Optional[Dict[str, Any]] = None
        for line in lines:
            self.append(line)

    def append(self, line: Dict[str, Any]) -> None:
        """Add the newest line (kept as it is until the next is appended, then pickled)."""
        if self._last is not None:
            self._packed.append(pickle.dumps(self._last, protocol=pickle.HIGHEST_PROTOCOL))
        self._last = line

    def __len__(self) -> int:
        return len(self._packed) + (self._last is not None)

    def __getitem__(self, index: Union[int, slice]) -> Any:
        if isinstance(index, slice):
            return [self[k] for k in range(*index.indices(len(self)))]
        size = len(self)
        position = index + size if index < 0 else index
        if not 0 <= position < size:
            raise IndexError(f"history index {index} out of range for {size} lines")
        return self._last if position == size - 1 else pickle.loads(self._packed[position])

    def __iter__(self) -> Iterator[Dict[str, Any]]:
        for packed in self._packed:
            yield pickle.loads(packed)
        if self._last is not None:
            yield self._last

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (History, list, tuple)):
            return len(self) == len(other) and all(a == b for a, b in zip(self, other))
        return NotImplemented

    def __repr__(self) -> str:
        return f"History({len(self)} lines)"

    @property
    def packed_bytes(self) -> int:
        """Bytes of the pickled lines (every line but the last)."""
        return sum(len(packed) for packed in self._packed)


__all__ = ["History"]
