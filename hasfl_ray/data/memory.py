"""How much memory a run's per-client arrays need, and refusing a client count that cannot fit."""

from __future__ import annotations

import os
from typing import Optional

from hasfl_ray.errors import ConfigError

#: Peak memory a run needs per client for its per-client arrays (sizes, tiers, the algorithm's state, the sampled
#: mask, the local-accuracy histograms, clients.csv's columns): 166 bytes measured on 10^7 synthetic clients (1.66
#: GB, battery 5's A181; the former 64 came from one round of 4 x 10^6), rounded up. A clock adds more (preparing.py).
BYTES_PER_CLIENT = 176


def physical_memory() -> Optional[int]:
    """This machine's physical memory in bytes, None where the system does not say."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, OSError, ValueError):
        return None


def _size(count: float) -> str:
    """``count`` bytes in decimal units, 3 significant figures (``640 TB``)."""
    unit = "bytes"
    for unit in ("bytes", "kB", "MB", "GB", "TB", "PB"):
        if count < 1000 or unit == "PB":
            break
        count /= 1000
    return f"{count:.0f} {unit}" if unit == "bytes" else f"{count:.3g} {unit}"


def check_client_memory(num_clients: int, bytes_per_client: int = BYTES_PER_CLIENT, total: Optional[int] = None,
                        where: str = "this machine") -> None:
    """Refuse, in one sentence giving the estimate, a client count whose per-client arrays cannot fit in this
    machine's physical memory (before any of them is allocated: the alternative is a MemoryError traceback, or
    the machine swapping for minutes). ``total`` and ``where``: another memory to fit in (a GPU's)."""
    total = physical_memory() if total is None else total
    needed = num_clients * bytes_per_client
    if total is not None and needed > total:
        raise ConfigError(f"clients is {num_clients}, which needs about {_size(needed)} of memory "
                          f"({bytes_per_client:,} bytes a client) but {where} has {_size(total)}; expected at "
                          f"most about {total // bytes_per_client:,} clients")
