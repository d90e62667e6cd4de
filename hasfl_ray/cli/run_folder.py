"""`simulate`'s default run directory: one folder per configuration, ``runs/<dataset>-<algorithm>-s<seed>-<hash>``,
and ``runs/latest``, a link to the last run started under ``runs/``.

Two runs of different configurations never share a default folder, so a second ``hasfl-ray simulate`` with other
flags is never refused; the same configuration again goes to the same folder (``--resume`` alone continues it, a
plain run starts it again there). An explicit ``--out`` keeps the refusal of a folder that already holds a run."""

from __future__ import annotations

import hashlib
import json
import logging
import os
from typing import Any

from hasfl_ray.registry import folder_label, spec_label

logger = logging.getLogger(__name__)

#: The folder default run directories go in, and the name of the link to the last run started there.
RUNS, LATEST = "runs", "latest"
#: Hex digits of the configuration's sha256 in a default folder's name.
DIGITS = 8


def config_digest(config: Any) -> str:
    """The sha256 (hex) of everything a run's result depends on (:meth:`RunConfig.result_dict`: every key but how
    it is executed, the backend, Ray's placement, checkpoints, the data's path; the files it reads by their
    content, ``input_sha256``), written as sorted JSON: the same configuration gives the same digest on any
    machine and in any order of flags."""
    values = config.result_dict()
    values.pop("data_fingerprint", None)  # what the data turned out to be once loaded: not the configuration's
    if values.get("data_seed") == config.seed:  # --data-seed equal to --seed is the default's run
        values["data_seed"] = None
    text = json.dumps(values, sort_keys=True, default=repr, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def default_name(config: Any) -> str:
    """``<dataset>-<algorithm>-s<seed>[-d<data_seed>]-<8 hex>`` of a resolved config (a plug-in: its class name)."""
    seed = f"s{config.seed}"
    data_seed = getattr(config, "data_seed", None)
    if data_seed is not None and data_seed != config.seed:
        seed += f"-d{data_seed}"
    return f"{folder_label(config.dataset)}-{spec_label(config.algorithm)}-{seed}-{config_digest(config)[:DIGITS]}"


def default_out(config: Any) -> str:
    """The default run directory of a resolved config: ``runs/<default_name>``."""
    return os.path.join(RUNS, default_name(config))


def link_latest(out: str) -> bool:
    """Point ``<parent>/latest`` at the run directory ``out`` when ``out`` is a folder directly under ``runs/`` (the
    default, or an ``--out runs/NAME``); replaced atomically (a link made beside it, then renamed over it). A
    ``latest`` that is not a link (a folder or file of the user's) is left alone, said once in the log; a failure to
    write the link never stops the run. Returns whether it made ``runs/`` itself (:func:`unlink_latest` removes it
    again, with the link, for a start refused)."""
    parent, name = os.path.split(os.path.normpath(out))
    if name in ("", ".", "..", LATEST) or os.path.normpath(parent or os.curdir) != RUNS and \
            os.path.realpath(parent or os.curdir) != os.path.realpath(RUNS):
        return False
    link = os.path.join(parent, LATEST)
    if os.path.lexists(link) and not os.path.islink(link):
        logger.warning("%s is not a link, so it is left as it is (it would point at the last run started, %s)",
                       link, out)
        return False
    temporary = os.path.join(parent, f".{LATEST}.{os.getpid()}")
    made = not os.path.lexists(parent or os.curdir)
    try:
        os.makedirs(parent or os.curdir, exist_ok=True)  # runs/ itself: the run makes its own folder in it next
        if os.path.lexists(temporary):
            os.unlink(temporary)
        os.symlink(name, temporary)
        os.replace(temporary, link)
    except OSError as error:
        logger.warning("%s could not be pointed at %s (%s)", link, out, error.strerror or error)
        try:
            os.unlink(temporary)
        except OSError:
            pass
    return made


def unlink_latest(out: str, made_parent: bool = False) -> None:
    """Remove ``<parent>/latest`` when it points at ``out`` and ``out`` was never made (a start refused after the link
    was written: Ray's placement, a plug-in's first dispatch), so no link is left pointing nowhere; and the parent
    itself when :func:`link_latest` made it (``made_parent``) and nothing else is in it."""
    parent, name = os.path.split(os.path.normpath(out))
    link = os.path.join(parent, LATEST)
    if os.path.islink(link) and os.readlink(link) == name and not os.path.lexists(out):
        try:
            os.unlink(link)
        except OSError:
            pass
    if made_parent and not os.path.lexists(out):
        try:
            os.rmdir(parent or os.curdir)  # only when empty
        except OSError:
            pass
