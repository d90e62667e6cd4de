"""OpenMP's waiting threads told to sleep, not spin (issue 46 item 5): ``OMP_WAIT_POLICY=PASSIVE``.

With more than one intra-op thread, OpenMP's default lets a thread that finished its share spin on the CPU while it
waits for the others (GNU libgomp spins for a while before it sleeps). On a machine whose cores are shared (trainer
actors beside each other, a sweep's cells, anything else running) the spinning threads take the cores the working
ones need, and a loaded round was measured 3-30x slower (benchmarks/RESULTS.md). PASSIVE makes them sleep at once.
The policy is read once, when the OpenMP runtime loads with torch, so it must be in the environment before torch is
imported: the console script sets it first thing (:func:`passive_waits`), every Ray actor gets it in its
environment (:func:`actor_environment`), and ``hasfl-ray info`` says which policy this process runs with. A policy
the user set (ACTIVE or PASSIVE, in the environment) is left as it is; a value OpenMP does not take (an empty
``OMP_WAIT_POLICY=``, a misspelling: libgomp warns "Invalid value" and spins by default) is replaced by PASSIVE, and
``info`` says so. Nothing here changes a result: it is the scheduling of waiting threads only.
"""

from __future__ import annotations

import os
from typing import Dict, MutableMapping, Optional

VARIABLE = "OMP_WAIT_POLICY"
PASSIVE = "PASSIVE"
#: How the policy came to be, for ``hasfl-ray info``: set here (``hasfl-ray``) or found in the environment (``user``).
_SET_HERE = "_HASFL_RAY_SET_OMP_WAIT_POLICY"
#: The environment's value PASSIVE replaced, where OpenMP would not have taken it (for ``hasfl-ray info``).
_REPLACED = "_HASFL_RAY_REPLACED_OMP_WAIT_POLICY"


def is_policy(value: Optional[str]) -> bool:
    """Whether OpenMP takes ``value`` as a wait policy: ACTIVE or PASSIVE, any case, blanks around (libgomp's
    parse_wait_policy; anything else, the empty string included, is "Invalid value" and the default spin)."""
    return value is not None and value.strip().lower() in ("active", "passive")


def passive_waits(environ: Optional[MutableMapping[str, str]] = None) -> str:
    """Set ``OMP_WAIT_POLICY=PASSIVE`` in ``environ`` (default: this process's) unless it holds a policy already
    (:func:`is_policy`); returns the policy in force. Call it before torch is imported: a runtime already loaded
    has read its policy."""
    environ = os.environ if environ is None else environ
    if not is_policy(environ.get(VARIABLE)):
        if VARIABLE in environ:
            environ[_REPLACED] = environ[VARIABLE]
        environ[VARIABLE] = PASSIVE
        environ[_SET_HERE] = "1"
    return environ[VARIABLE]


def actor_environment() -> Dict[str, str]:
    """The variables every Ray actor's process starts with (``runtime_env`` ``env_vars``): this process's wait
    policy, PASSIVE unless the user chose another, so trainers on a cluster's other machines sleep too."""
    value = os.environ.get(VARIABLE)
    environment = {VARIABLE: value if is_policy(value) else PASSIVE}
    if "ONEDNN_PRIMITIVE_CACHE_CAPACITY" in os.environ:  # hasfl_ray/allocator.py's bound (or the user's), everywhere
        environment["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] = os.environ["ONEDNN_PRIMITIVE_CACHE_CAPACITY"]
    if "HASFL_MALLOC_TRIM" in os.environ:  # the driver's choice of hasfl_ray/allocator.py, on every machine
        environment["HASFL_MALLOC_TRIM"] = os.environ["HASFL_MALLOC_TRIM"]
    # large tensors in transparent huge pages (hasfl_ray/allocator.py), unless the driver's user turned it off
    environment["THP_MEM_ALLOC_ENABLE"] = os.environ.get("THP_MEM_ALLOC_ENABLE", "1")
    return environment


def wait_policy() -> Dict[str, str]:
    """``{"OMP_WAIT_POLICY": value or "unset (OpenMP's default: spin, then sleep)", "set_by": ...}`` of this
    process, as ``hasfl-ray info`` prints it."""
    value = os.environ.get(VARIABLE)
    if value is None:
        return {VARIABLE: "unset (OpenMP's default: spin, then sleep)", "set_by": "nobody"}
    if not is_policy(value):
        return {VARIABLE: f"{value!r} (not a policy OpenMP takes: its default, spin, then sleep)",
                "set_by": "the environment"}
    if os.environ.get(_SET_HERE) != "1":
        return {VARIABLE: value, "set_by": "the environment"}
    replaced = os.environ.get(_REPLACED)
    return {VARIABLE: value, "set_by": "hasfl-ray" if replaced is None else
            f"hasfl-ray, in place of the environment's {replaced!r}, which OpenMP does not take"}
