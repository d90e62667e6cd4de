"""The clients' training loss in a run's records (issue 45 item 5): metrics.jsonl's ``train_loss`` (the mean over a
round's accepted clients of each one's mean loss over its local steps) and ``train_loss_by_client``, clients.csv's
``train_loss`` (each client's at the last round it trained; empty for a client that never did).

The loss a client reports is :attr:`~hasfl_ray.training.result.ClientResult.loss`: the mean of its local steps'
objective losses, summed in float64 the same way by every training path (one at a time, batched, mixed), so the
paths agree on it to the float tolerance their updates agree to. Reading it changes nothing a run computes.
"""

from __future__ import annotations

import math
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence

import numpy as np

#: metrics.jsonl's keys of the clients' training loss.
TRAIN_LOSS, BY_CLIENT = "train_loss", "train_loss_by_client"


def loss_keys(results: Sequence[Any]) -> Dict[str, Any]:
    """A round's (or server update's) loss keys from its accepted :class:`ClientResult` s: ``train_loss`` (None when
    no accepted client took a local step) and ``train_loss_by_client`` (client id as a string -> its loss)."""
    trained = [r for r in results if r.steps > 0 and math.isfinite(r.loss)]
    by_client = {str(r.client): float(r.loss) for r in sorted(trained, key=lambda r: r.client)}
    mean = float(math.fsum(by_client.values()) / len(by_client)) if by_client else None
    return {TRAIN_LOSS: mean, BY_CLIENT: by_client}


def last_losses(history: Iterable[Mapping[str, Any]], clients: int) -> np.ndarray:
    """clients.csv's ``train_loss`` column: each client's loss in the last line that has it (NaN: none; lines
    written before the key existed have none)."""
    column = np.full(clients, np.nan, dtype=np.float64)
    for line in history:
        for client, loss in (line.get(BY_CLIENT) or {}).items():
            if loss is not None:
                column[int(client)] = loss
    return column


def final_train_loss(lines: Sequence[Mapping[str, Any]]) -> Optional[float]:
    """The final line's ``train_loss`` with one (the summary's ``final_train_loss``); None when none has it."""
    values: List[float] = [line[TRAIN_LOSS] for line in lines if line.get(TRAIN_LOSS) is not None]
    return values[-1] if values else None
