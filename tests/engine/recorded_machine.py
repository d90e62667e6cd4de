"""Whether this machine is the machine type a stored fixture's params_sha256 were recorded on.

:func:`hasfl_ray.training.determinism.machine_type` names the processor by its model name, which a virtual machine
may give as a family ("AMD EPYC") covering several generations whose kernels can round differently; the fixtures'
machine.json also records the processor's family, model and stepping (``cpu_id``), and a recorded hash is compared
only where every recorded key matches this machine's (a key the record lacks counts as a difference).
"""

import json
from pathlib import Path
from typing import Dict, Optional

from hasfl_ray.training.determinism import machine_type


def cpu_id() -> str:
    """``family/model/stepping`` from /proc/cpuinfo ("" where it cannot be read)."""
    fields = {}
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                key, _, value = line.partition(":")
                key = key.strip()
                if key in ("cpu family", "model", "stepping") and key not in fields:
                    fields[key] = value.strip()
                if not line.strip():
                    break
    except OSError:
        return ""
    return "/".join(fields.get(key, "?") for key in ("cpu family", "model", "stepping"))


def this_machine() -> Dict[str, str]:
    return {**machine_type(), "cpu_id": cpu_id()}


def other_machine(record: Path) -> Optional[str]:
    """Why this machine is not the one ``record`` (a machine.json) names; None when it is."""
    recorded = json.loads(record.read_text(encoding="utf-8"))
    here = this_machine()
    differ = [f"{key} {recorded.get(key)!r} there, {here[key]!r} here" for key in here if recorded.get(key) != here[key]]
    return "; ".join(differ) or None
