"""The run directory contract: config.yaml, metrics.jsonl, metrics.csv, clients.csv, summary.json, log.txt,
checkpoints/, events/."""

from __future__ import annotations

import csv
import errno
import fcntl
import fnmatch
import json
import math
import os
import tempfile
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence

import yaml

from hasfl_ray.engine.earlier_run import drop
from hasfl_ray.engine.metrics_csv import MetricsTable
from hasfl_ray.errors import ConfigError
from hasfl_ray.front_end import option
from hasfl_ray.files import (TEMP_PREFIX, atomic_text_writer, atomic_write, make_folders, ownership_problem,  # noqa: F401
                             path_kind, remove_made)

#: What a run writes into its directory: ``--force`` clears a folder only when it holds nothing else.
RUN_FILES = frozenset({"config.yaml", "metrics.jsonl", "metrics.csv", "clients.csv", "summary.json", "log.txt"})
#: The folders a run writes, each with the names of the files a run writes in it: the checkpoint
#: (``hasfl_ray.engine.checkpoint``) and TensorBoard's event files (``events.out.tfevents.<time>.<host>.<pid>.<n>``).
RUN_FOLDERS = {"checkpoints": ("latest.pt",), "events": ("events.out.tfevents.*",)}
CLIENT_COLUMNS = ("client", "num_samples", "p_max", "tv_distance", "h_tilde", "p_final", "name",
                  # local accuracy (docs/metrics.md); empty where the dataset does not define it
                  "local_accuracy", "local_accuracy_unmasked", "local_width", "local_test_samples",
                  # the client's training loss at the last round it trained (empty: never; issue 45)
                  "train_loss")
METRIC_KEYS = ("round", "test_accuracy", "test_loss", "avg_p", "coverage", "frozen_fraction", "mean_h",
               "rejected_updates", "wall_s")


#: Names in a run directory that must not be symbolic links when a run starts or resumes: a write, the log or a
#: read of the checkpoint would follow the link out of the run directory.
NO_LINKS = ("config.yaml", "metrics.jsonl", "metrics.csv", "clients.csv", "summary.json", "log.txt", "checkpoints",
            "checkpoints/latest.pt", "events")
#: Room left in a path for what a run writes inside its directory (``events/events.out.tfevents.<time>.<host>...``).
INSIDE_BYTES = 128


def _shown(name: str) -> str:
    """``name`` quoted for a sentence, its middle cut when it is long."""
    return repr(name) if len(name) <= 60 else repr(name[:30]) + "..." + repr(name[-20:])


def _check_lengths(path: str, where: str, what: str, fix: str) -> None:
    """Raise ConfigError when a folder of ``path`` still to be made under ``where`` has a name longer than the
    filesystem allows, or ``path`` leaves too little room for the files a run writes in it (checked before any
    folder is made, so that a refused path leaves none of its parents behind)."""
    def limit(name: str, default: int) -> int:
        try:
            return os.pathconf(where, name)
        except (OSError, ValueError):
            return default

    name_max, path_max = limit("PC_NAME_MAX", 255), limit("PC_PATH_MAX", 4096)
    part, rest = os.path.basename(path.rstrip(os.sep)), os.path.dirname(path.rstrip(os.sep))
    while part:
        if len(os.fsencode(part)) > name_max:
            raise ConfigError(f"{what} {_shown(path)} cannot be made: its folder name {_shown(part)} is "
                              f"{len(os.fsencode(part))} bytes; expected at most {name_max} ({fix})")
        if not rest or os.path.lexists(rest):
            break
        part, rest = os.path.basename(rest), os.path.dirname(rest)
    size = len(os.fsencode(path))
    if size + INSIDE_BYTES > path_max:
        raise ConfigError(f"{what} {_shown(path)} is a path of {size} bytes; expected at most "
                          f"{path_max - INSIDE_BYTES}, leaving room for the files inside ({fix})")


def check_run_directory(path: str, what: str = "run directory", fix: Optional[str] = None) -> None:
    """Raise ConfigError (one sentence, before anything is written) unless ``path`` is a folder a run can write, or
    a path where one can be made: not a file or device, not under a file, not the root folder, and writable (checked
    with ``os.access`` and a trial folder made and removed at once, which catches /proc, read-only filesystems and
    missing permissions, root's included). ``what`` names the folder in the sentence (a report's output folder),
    ``fix`` says what to do instead (default: choose another ``--out``, or ``out_dir`` in the API)."""
    fix = fix or f"choose another {option('out')}"
    if not path:
        raise ConfigError(f"{what} is ''; expected a folder path ({fix})")
    if os.path.realpath(path) == os.path.realpath(os.sep):
        raise ConfigError(f"{what} {path!r} is the root folder; expected a folder of its own ({fix})")
    if os.path.lexists(path):
        if not os.path.isdir(path):
            raise ConfigError(f"{what} {path!r} is {path_kind(path)}; expected a folder ({fix})")
        where = path
    else:
        where = os.path.dirname(path.rstrip(os.sep)) or os.curdir  # the nearest folder that exists
        while not os.path.lexists(where):
            where = os.path.dirname(where) or os.curdir
        if not os.path.isdir(where):
            raise ConfigError(f"{what} {path!r} cannot be made: {where!r} is {path_kind(where)}; expected a path "
                              f"under folders ({fix})")
        _check_lengths(path, where, what, fix)
    problem = None if os.access(where, os.W_OK | os.X_OK) else "permission denied"
    if problem is None:
        try:
            os.rmdir(tempfile.mkdtemp(prefix=TEMP_PREFIX + "probe-", dir=where))
        except OSError as error:
            problem = error.strerror or str(error)
    if problem is not None:
        verb = "written" if where == path else "made"
        folder = "" if where == path else f" in {where!r}"
        raise ConfigError(f"{what} {path!r} cannot be {verb}{folder} ({problem}); expected a writable folder "
                          f"({fix})")


def check_output_folder(path: str, holds: str, what: str, fix: str) -> None:
    """Raise ConfigError (one sentence, before anything is written) unless hasfl-ray may write its ``holds`` files
    (``report``, ``control variates``: :data:`hasfl_ray.files.FOLDER_KINDS`) into ``path``: a folder that can be
    written (:func:`check_run_directory`) and is missing, empty or hasfl-ray's for them
    (:func:`hasfl_ray.files.ownership_problem`): every folder hasfl-ray writes besides a run directory."""
    check_run_directory(path, what, fix)
    problem = ownership_problem(path, holds)
    if problem:
        raise ConfigError(f"{what} {path!r} {problem}; expected a new or empty folder, or one hasfl-ray marked "
                          f"({fix})")


def check_no_links(path: str) -> None:
    """Raise ConfigError (one sentence) when a run file of ``path`` (:data:`NO_LINKS`) is a symbolic link, or is
    not what a run writes there: a FIFO, a device or a socket (opening one to read or append would block forever)
    where a file goes, anything but a folder where a folder goes."""
    for name in NO_LINKS:
        entry = os.path.join(path, name)
        if os.path.islink(entry):
            raise ConfigError(f"run directory {path!r} has {name} as a link to {os.readlink(entry)!r}; expected the "
                              f"run's own file, never followed (remove the link, or choose another {option('out')})")
        folder = name in RUN_FOLDERS
        if os.path.exists(entry) and not (os.path.isdir(entry) if folder else os.path.isfile(entry)):
            kind = path_kind(entry)
            raise ConfigError(f"run directory {path!r} has {name} that is {kind}; expected the run's own "
                              f"{'folder' if folder else 'file'} (remove it, or choose another {option('out')})")


class RunLock:
    """An exclusive lock on a run directory for as long as a run writes it (``flock`` on the directory itself, so
    it is released when the process ends, however it ends). A second run pointed at the same directory is
    refused in one sentence instead of interleaving its outputs. ``what`` and ``who`` name the folder and its writer
    in that sentence (a sweep locks its folder as ``"sweep folder"``, ``"sweep"``), ``remedy`` what to do instead
    of waiting."""

    def __init__(self, path: str, what: str = "run directory", who: str = "run", remedy: Optional[str] = None):
        self.path, self.what, self.who = path, what, who
        self.remedy = remedy or f"choose another {option('out')}"
        self._fd: Optional[int] = None
        self.made: List[str] = []  #: the folders acquire made (the directory and its missing parents)

    def acquire(self) -> "RunLock":
        try:
            self.made = make_folders(self.path)
            fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY)
        except OSError as error:  # check_run_directory said it could be made; something changed since
            remove_made(self.made)
            raise ConfigError(f"{self.what} {self.path!r} cannot be made ({error.strerror or error}); expected a "
                              f"writable folder (choose another {option('out')})") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as error:
            os.close(fd)
            if error.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise ConfigError(f"{self.what} {self.path!r} is being written by another hasfl-ray {self.who}; "
                                  f"expected one {self.who} per folder at a time (wait for it, or {self.remedy})"
                                  ) from None
            raise
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the descriptor drops the flock
            self._fd = None

    def __enter__(self) -> "RunLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def check_start(path: str, resume: bool = False, force: bool = False) -> None:
    """Raise ConfigError (one sentence, before anything is written) unless a run may start in ``path``: a new run
    only in a missing or empty folder, or in a run directory (config.yaml) with ``force`` (:func:`check_clearable`
    judges the rest); ``resume`` only a run directory, or a missing or empty folder (where it starts at round 0)."""
    entries = sorted(os.listdir(path)) if os.path.isdir(path) else []
    if not entries:
        return
    if "config.yaml" in entries:
        if not (resume or force):
            raise ConfigError(f"run directory {path!r} already holds a run; expected a new directory, "
                              f"{option('resume')} to continue it, or {option('force')} to overwrite it")
        return
    if resume:
        kind = "a sweep's folder (sweep.json), not a run directory" if "sweep.json" in entries else \
            "not a run directory"
        raise ConfigError(f"{option('resume')} cannot continue {path!r}: it holds no config.yaml, so it is {kind}; "
                          "expected the folder of the run to continue (a sweep's runs are its cell folders)")
    if not force:
        raise ConfigError(f"run directory {path!r} holds {_listed(entries)} and no run (no config.yaml); expected "
                          f"a missing or empty folder for a new run (choose another {option('out')})")


class RunDirectory:
    """Writes one run's outputs under ``path``."""

    def __init__(self, path: str):
        self.path = path
        self._metrics_text = ""
        self._table = MetricsTable()  # metrics.csv's text (hasfl_ray.engine.metrics_csv)
        self.earlier = False  #: an earlier run set aside by --force (hasfl_ray.engine.earlier_run) until a line

    def file(self, name: str) -> str:
        return os.path.join(self.path, name)

    def check_clearable(self) -> None:
        """Raise ConfigError unless ``--force`` may clear this directory: see :func:`check_clearable`."""
        check_clearable(self.path)

    def create(self, config: Mapping[str, Any], execution: Mapping[str, Any]) -> None:
        os.makedirs(self.path, exist_ok=True)
        text = yaml.safe_dump(dict(config), sort_keys=False) + "# execution (does not change results)\n" + \
            "".join(f"# {k}: {v}\n" for k, v in execution.items())
        atomic_write(self.file("config.yaml"), text.encode())

    def reset_metrics(self, lines: Iterable[Dict[str, Any]] = ()) -> None:
        lines = list(lines)
        self._metrics_text = "".join(json.dumps(line) + "\n" for line in lines)
        atomic_write(self.file("metrics.jsonl"), self._metrics_text.encode())
        atomic_write(self.file("metrics.csv"), self._table.reset(lines).encode())  # the same rounds, scalars only

    def append_metrics(self, line: Dict[str, Any]) -> None:
        """Add one round's line (and its row of metrics.csv); each file is rewritten whole through
        :func:`atomic_write`, so a crash or a full disk leaves the previous version (never a half line)."""
        text = self._metrics_text + json.dumps(line) + "\n"
        atomic_write(self.file("metrics.jsonl"), text.encode())
        self._metrics_text = text
        atomic_write(self.file("metrics.csv"), self._table.add(line).encode())
        self._table.commit()
        if self.earlier:  # the new run recorded its first line: --force's earlier run is no longer kept
            drop(self.path)
            self.earlier = False

    def read_metrics(self) -> List[Dict[str, Any]]:
        if not os.path.exists(self.file("metrics.jsonl")):
            return []
        with open(self.file("metrics.jsonl"), encoding="utf-8") as handle:
            return [json.loads(line) for line in handle if line.strip()]

    def write_clients(self, rows: Iterable[Sequence[Any]], extra_columns: Sequence[str] = ()) -> None:
        """clients.csv from rows of :data:`CLIENT_COLUMNS` values (sequences, or mappings by column), streamed to
        the file as they come (a million clients never sit in memory as rows), which replaces the old one only
        once complete. ``extra_columns``: columns after those (the device clock's, docs/clock.md)."""
        columns = CLIENT_COLUMNS + tuple(extra_columns)
        with atomic_text_writer(self.file("clients.csv")) as handle:
            writer = csv.writer(handle, lineterminator="\n")
            writer.writerow(columns)
            writer.writerows([row[c] for c in columns] if isinstance(row, Mapping) else row for row in rows)

    def write_summary(self, summary: Dict[str, Any]) -> None:
        """summary.json, strict JSON: a number that is not finite (an accuracy never reached, a diverged loss) is
        written as null, never as Infinity or NaN, which JSON readers other than Python's refuse."""
        atomic_write(self.file("summary.json"), summary_json(summary).encode())


def summary_json(summary: Mapping[str, Any]) -> str:
    """summary.json's text: strict JSON, indented, a number that is not finite written as null (what the file holds
    and ``simulate --json`` prints)."""
    return json.dumps(_finite(summary), indent=2, allow_nan=False) + "\n"


def _finite(value: Any) -> Any:
    """``value`` with every float that is not finite replaced by None, through mappings, lists and tuples."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(item) for item in value]
    return value


def _protected(path: str) -> Optional[str]:
    """Why ``path`` may never be cleared (the root, the home folder, the current folder or one above it)."""
    real = os.path.realpath(path)
    if real == os.path.realpath(os.sep):
        return "it is the root folder"
    if real == os.path.realpath(os.path.expanduser("~")):
        return "it is the home folder"
    cwd = os.path.realpath(os.getcwd())
    if cwd == real or cwd.startswith(real.rstrip(os.sep) + os.sep):
        return "it is the current folder" if cwd == real else "it holds the current folder"
    return None


def foreign_entries(path: str) -> List[str]:
    """The entries of ``path`` that no run writes (sorted): anything besides the plain files :data:`RUN_FILES`,
    the real folders :data:`RUN_FOLDERS` and, inside those, the plain files a run writes there by name, and
    temporary files of an interrupted write. A foreign entry inside a run's folder is named with it
    (``checkpoints/my-best.pt``)."""
    def written(entry: os.DirEntry, names: Iterable[str]) -> bool:
        return entry.is_file(follow_symlinks=False) and (
            entry.name.startswith(TEMP_PREFIX) or any(fnmatch.fnmatchcase(entry.name, name) for name in names))

    foreign = []
    for entry in os.scandir(path):
        if written(entry, RUN_FILES):
            continue
        if entry.name in RUN_FOLDERS and entry.is_dir(follow_symlinks=False):
            foreign += [f"{entry.name}/{inner.name}" + ("/" if inner.is_dir(follow_symlinks=False) else "")
                        for inner in os.scandir(entry.path) if not written(inner, RUN_FOLDERS[entry.name])]
            continue
        foreign.append(entry.name + ("/" if entry.is_dir(follow_symlinks=False) else ""))
    return sorted(foreign)


def _listed(names: Sequence[str]) -> str:
    """The first five of ``names`` and how many more, for a sentence."""
    return ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")


def check_clearable(path: str) -> None:
    """Raise ConfigError (one sentence, before anything is deleted) unless ``path`` is absent, empty, or a run
    directory (config.yaml, and nothing a run does not write); never the root, home or current folder."""
    if not os.path.lexists(path):
        return
    if not os.path.isdir(path) or os.path.islink(path):
        raise ConfigError(f"{option('force')} cannot clear {path!r}: it is not a folder; expected a run directory")
    entries = os.listdir(path)
    if not entries:
        return
    reason = _protected(path)
    if reason:
        raise ConfigError(f"{option('force')} refuses to clear {path!r}: {reason}; expected a run directory of its own "
                          f"(choose another {option('out')})")
    if "config.yaml" not in entries:
        raise ConfigError(f"{option('force')} refuses to clear {path!r}: it holds no config.yaml, so it is not a run "
                          f"directory; expected an empty folder or one a run wrote (choose another {option('out')})")
    foreign = foreign_entries(path)
    if foreign:
        raise ConfigError(f"{option('force')} refuses to clear {path!r}: it holds {_listed(foreign)}, which no run "
                          f"writes; expected a folder with only a run's files (move them, or choose another "
                          f"{option('out')})")


def clear_run_directory(path: str) -> None:
    """Delete what a run wrote in ``path`` (after :func:`check_clearable`), keeping the folder itself."""
    import shutil

    check_clearable(path)
    if not os.path.isdir(path):
        return
    for entry in os.scandir(path):
        if entry.is_dir(follow_symlinks=False):
            shutil.rmtree(entry.path)
        else:
            os.unlink(entry.path)


def history_line_problem(line: Dict[str, Any], index: int) -> Optional[str]:
    """What is wrong with checkpoint history line ``index`` (a metrics.jsonl line: round ``index`` and a number for
    every key of :data:`METRIC_KEYS`, ``mean_h`` possibly null, ``test_accuracy`` and ``test_loss`` null together on
    a line that was not evaluated), None when nothing is. Which lines were evaluated is not the checkpoint's config
    to say: an asynchronous update is evaluated by ``eval_every_updates``/``eval_every_seconds``, a round by
    ``test_every``, and each may change when the run is resumed (an execution field), so a null pair is taken as
    an unevaluated line whatever the cadence in force now."""
    missing = [key for key in METRIC_KEYS if key not in line]
    if missing:
        return f"has no {missing[0]!r}"
    unevaluated = line["test_accuracy"] is None and line["test_loss"] is None
    for key in METRIC_KEYS:
        value = line[key]
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if not number and not (value is None and (key == "mean_h" or (unevaluated and key.startswith("test_")))):
            return f"has {key} {value!r}, not a number"
    return None if line["round"] == index else f"is of round {line['round']!r}"
