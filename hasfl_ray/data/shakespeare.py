"""Shakespeare next-character prediction built as LEAF builds it: one client per speaking role, 80-char windows."""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch

from hasfl_ray.data.base import Dataset, FederatedDataset, TextFederatedDataset
from hasfl_ray.data.download import (SHAKESPEARE_FILENAME, download_shakespeare, resolve_data_dir,
                                     short_reason)
from hasfl_ray.errors import DataError
from hasfl_ray.files import read_regular
from hasfl_ray.registry import register_dataset

logger = logging.getLogger(__name__)

#: Window length: 80 characters predict the 81st.
SEQ_LEN = 80
#: The fixed vocabulary: printable ASCII 32..126, so symbol index = ord(char) - 32.
VOCAB = "".join(chr(code) for code in range(32, 127))
#: Every character outside VOCAB (line breaks, tabs, accented letters) becomes this symbol (ours: LEAF's 80-symbol
#: vocabulary gives an unknown character the index -1).
UNKNOWN_SYMBOL = " "
UNKNOWN_INDEX = VOCAB.index(UNKNOWN_SYMBOL)
#: A role needs this many characters of dialogue (1,000 characters = 920 stride-1 windows) to be a client.
MIN_ROLE_CHARS = 1000
#: Share of each role's windows, in text order, that trains; the rest (after a gap) is its test data.
TRAIN_FRACTION = 0.8
#: LEAF's minibatch size for Shakespeare.
RECOMMENDED_BATCH_SIZE = 10

_HEADING = re.compile(r"^(ACT|Act|SCENE|Scene|Actus|Scena)\b")
_COLON_SPEAKER = re.compile(r"^([A-Za-z][A-Za-z' ,&.\-]{0,40}):$")
_PERIOD_SPEAKER = re.compile(r"^([A-Z][A-Za-z' \-]{0,40}?)\.$")
_CAPS_SPEAKER = re.compile(r"^([A-Z][A-Z' \-]{1,40})$")
_BYLINE = re.compile(r"^\s*by\s+William\s+Shakespeare", re.IGNORECASE)
_ROMAN_NUMERAL = re.compile(r"^[IVXLCDM]+$")
#: Lower-case words a role name may contain ("Duke of York", "Ros. and Guil."); any other marks a prose line.
_NAME_PARTICLES = frozenset({"and", "of", "the", "de", "du", "la", "le"})
_STAGE_DIRECTION = re.compile(r"\[[^\]]*\]")
_BLANK_LINES = re.compile(r"\n[ \t]*(?:\n[ \t]*)+")
_WHITESPACE = re.compile(r"\s+")


def encode(text: str) -> np.ndarray:
    """Symbol indices (uint8) of ``text`` in :data:`VOCAB`; unknown characters map to :data:`UNKNOWN_INDEX`."""
    codes = np.frombuffer(text.encode("utf-32-le"), dtype="<u4")
    known = (codes >= 32) & (codes <= 126)
    return np.where(known, codes - 32, UNKNOWN_INDEX).astype(np.uint8)


def decode(indices: Sequence[int] | np.ndarray | torch.Tensor) -> str:
    """The text of symbol indices (inverse of :func:`encode` on known characters)."""
    return "".join(VOCAB[int(i)] for i in np.asarray(indices).reshape(-1))


def _speaker(line: str) -> Optional[str]:
    """The normalised role name if ``line`` is a speaker line (``NAME:``, ``Name.`` or ``NAME``), else None.

    A name has at most four words, each capitalised or a particle (of, and, the, ...), and is not a
    lone roman numeral (the sonnets' numbering).
    """
    line = line.strip()
    match = _COLON_SPEAKER.match(line) or _PERIOD_SPEAKER.match(line) or _CAPS_SPEAKER.match(line)
    if match is None:
        return None
    words = match.group(1).split()
    if not words or len(words) > 4 or _ROMAN_NUMERAL.match(words[0]) and len(words) == 1:
        return None
    if any(word[0].islower() and word not in _NAME_PARTICLES for word in words):
        return None
    return " ".join(words).upper()


def parse_speeches(text: str) -> Dict[str, List[str]]:
    """Speeches per role, in order of appearance, from play text with speaker lines.

    Speeches are blocks separated by blank lines. A block whose first line is a speaker line and which
    has more lines starts a speech of that role (``NAME:`` as in tinyshakespeare, ``Name.`` or ``NAME.``
    as in the Gutenberg plays, or a bare upper-case ``NAME``); a following block without a speaker line
    continues the current speech (songs, letters). ``ACT``/``SCENE`` headings and title blocks (a line
    then ``by William Shakespeare``) end the current speaker, so titles, cast lists, scene descriptions
    and the poems belong to no one. Bracketed stage directions are dropped,
    and whitespace runs, line breaks included, become one space.
    """
    roles: Dict[str, List[str]] = {}
    current: Optional[str] = None
    for block in _BLANK_LINES.split(text.replace("\r\n", "\n").replace("\r", "\n")):
        lines = [line for line in block.split("\n") if line.strip()]
        if not lines:
            continue
        if _HEADING.match(lines[0].strip()) or (len(lines) > 1 and _BYLINE.match(lines[1])):
            current = None
            continue
        speaker = _speaker(lines[0]) if len(lines) > 1 else None
        if speaker is not None:
            current, body = speaker, lines[1:]
        elif current is not None:
            body = lines
        else:
            continue
        speech = _WHITESPACE.sub(" ", _STAGE_DIRECTION.sub(" ", "\n".join(body))).strip()
        if speech:
            roles.setdefault(current, []).append(speech)
    return roles


@dataclass
class RoleText:
    """One user's symbols and, when they are not simply every position, its window starts.

    Attributes:
        name: client name (``play/ROLE``, ``ROLE`` when plays are unknown, or the LEAF user).
        symbols: uint8 symbol indices (L,).
        starts: int64 window starts into ``symbols`` in text order; None means 0..L-SEQ_LEN-1.
    """

    name: str
    symbols: np.ndarray
    starts: Optional[np.ndarray] = None

    def window_starts(self) -> np.ndarray:
        if self.starts is not None:
            return self.starts
        return np.arange(max(len(self.symbols) - SEQ_LEN, 0), dtype=np.int64)


def _read_text(path: Path) -> str:
    return read_regular(str(path), "Shakespeare text").decode("utf-8", errors="replace")  # a FIFO is refused


def roles_from_text(path: Path, play: Optional[str] = None) -> List[RoleText]:
    """Roles of one raw text file; names are ``play/ROLE`` when ``play`` is given, else ``ROLE``."""
    speeches = parse_speeches(_read_text(path))
    prefix = f"{play}/" if play else ""
    return [RoleText(prefix + role, encode(" ".join(parts))) for role, parts in speeches.items()]


def roles_from_leaf(paths: Sequence[Path]) -> List[RoleText]:
    """Users of LEAF ``all_data`` JSON files (a user split across files keeps its file order).

    Consecutive windows that overlap (``x[j] == x[j-1][1:] + y[j-1]``, as LEAF's sliding windows do)
    share one stored stream, so a user costs about one byte per sample rather than 81.
    """
    samples: Dict[str, Tuple[List[str], List[str]]] = {}
    for path in paths:
        hint = "pass --data-dir pointing at LEAF's all_data.json (or a folder of them) or at raw play text"
        raw = read_regular(str(path), "LEAF file")  # a FIFO is refused before it is opened
        try:
            data = json.loads(raw.decode("utf-8"))
        except (ValueError, RecursionError) as error:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
            reason = "nested too deeply to read" if isinstance(error, RecursionError) else short_reason(error)
            raise DataError(f"{path} is not valid LEAF JSON ({reason}); {hint}") from None
        if not (isinstance(data, dict) and isinstance(data.get("users"), list)
                and isinstance(data.get("user_data"), dict)):
            raise DataError(f"{path} is not LEAF JSON: it lacks the users list and user_data object; {hint}")
        listed = set()
        for user in data["users"]:
            if not isinstance(user, str) or user in listed:
                problem = "is listed twice" if isinstance(user, str) else "is not a name (text)"
                raise DataError(f"{path} is not LEAF JSON: user {user!r} of its users list {problem}; {hint}")
            listed.add(user)
            record = data["user_data"].get(user)
            if not (isinstance(record, dict) and isinstance(record.get("x"), list)
                    and isinstance(record.get("y"), list) and len(record["x"]) == len(record["y"])):
                raise DataError(f"{path} is not LEAF JSON: user {user!r} lacks equally long x and y lists; {hint}")
            xs, ys = samples.setdefault(str(user), ([], []))
            xs.extend(record["x"])
            ys.extend(record["y"])
    roles = []
    for user, (xs, ys) in samples.items():
        pieces: List[str] = []
        starts = np.empty(len(xs), dtype=np.int64)
        length, previous = 0, None
        for j, (x, y) in enumerate(zip(xs, ys)):
            if not (isinstance(x, str) and isinstance(y, str) and len(x) == SEQ_LEN and len(y) == 1):
                raise DataError(f"LEAF user {user!r} sample {j} is not an {SEQ_LEN}-character window and one "
                                "next character; pass --data-dir pointing at Shakespeare data built with "
                                f"{SEQ_LEN}-character windows")
            if x == previous:
                starts[j] = starts[j - 1] + 1
                pieces.append(y)
                length += 1
            else:
                starts[j] = length
                pieces.append(x + y)
                length += SEQ_LEN + 1
            previous = x[1:] + y
        roles.append(RoleText(user, encode("".join(pieces)), starts))
    return roles


def find_source(path: Path, depth: int = 0) -> Optional[Tuple[str, List[Path]]]:
    """What ``path`` holds: ("leaf", json files), ("plays", *_gut.txt files) or ("text", [one file]).

    A folder is searched in this order: *.json, *_gut.txt, then the sub-folders all_data/ and plays/,
    then tinyshakespeare.txt or input.txt, then a shakespeare/ sub-folder.
    """
    if path.is_file():
        return ("leaf" if path.suffix == ".json" else "text"), [path]
    if not path.is_dir() or depth > 2:
        return None
    jsons = sorted(path.glob("*.json"))
    if jsons:
        return "leaf", jsons
    plays = sorted(path.glob("*_gut.txt"))
    if plays:
        return "plays", plays
    for folder in ("all_data", "plays"):
        found = find_source(path / folder, depth + 1) if (path / folder).is_dir() else None
        if found:
            return found
    for name in (SHAKESPEARE_FILENAME, "input.txt"):
        if (path / name).is_file():
            return "text", [path / name]
    if (path / "shakespeare").is_dir():
        return find_source(path / "shakespeare", depth + 1)
    return None


def split_windows(starts: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """(train, test) window starts of one role: the first TRAIN_FRACTION of its windows in text order,
    then every later window whose input does not overlap the last training window's input.

    With stride-1 windows this drops the SEQ_LEN - 1 = 79 windows after the training part, as LEAF does.
    """
    num_train = int(TRAIN_FRACTION * len(starts))
    if num_train == 0:
        return starts[:0], starts[:0]
    rest = starts[num_train:]
    return starts[:num_train], rest[rest >= starts[num_train - 1] + SEQ_LEN]


def load_roles(data_dir: str | None = None, download: bool = False) -> Tuple[List[RoleText], Path]:
    """Every role (user) found at ``data_dir``, and the path read."""
    root = resolve_data_dir(data_dir)
    found = find_source(root)
    if found is None and download:
        found = "text", [download_shakespeare(root)]
    if found is None:
        raise DataError(f"no Shakespeare data found at {root}; expected --data-dir at LEAF JSON, play texts "
                        f"(*_gut.txt, plays/) or {SHAKESPEARE_FILENAME}, or --download (docs/datasets.md)")
    kind, paths = found
    if kind == "leaf":
        roles = roles_from_leaf(paths)
    elif kind == "plays":
        roles = [role for path in paths for role in roles_from_text(path, play=path.stem.removesuffix("_gut"))]
    else:
        roles = roles_from_text(paths[0])
    source = paths[0] if len(paths) == 1 else paths[0].parent
    if not roles:
        raise DataError(f"{source} holds no speeches (no 'NAME:', 'Name.' or LEAF users); pass --data-dir pointing "
                        "at Shakespeare play text or LEAF all_data JSON")
    return roles, source


def load_shakespeare(num_clients: int, data_dir: str | None = None, download: bool = False, stride: int = 1,
                     min_role_chars: int = MIN_ROLE_CHARS) -> TextFederatedDataset:
    """The ``num_clients`` roles with the most dialogue as clients, next-character windows split per role.

    Args:
        num_clients: how many roles to keep (the largest; ties broken by name).
        data_dir: LEAF all_data JSON (file or folder), a folder of per-play ``*_gut.txt`` texts, or one
            raw text with speaker lines (plays unknown); see :func:`find_source`.
        download: where nothing is found, say in one sentence where LEAF's data comes from (nothing is fetched:
            :func:`~hasfl_ray.data.download.download_shakespeare`).
        stride: keep every ``stride``-th window (train and test); 1 is LEAF's sliding window.
        min_role_chars: fewest characters of dialogue (stride-1 windows + SEQ_LEN) a role needs.
    """
    if not isinstance(stride, int) or stride < 1:
        raise DataError(f"stride is {stride!r}; expected a positive integer")
    roles, source = load_roles(data_dir, download)
    usable = []
    for role in roles:
        all_starts = role.window_starts()
        if len(all_starts) + SEQ_LEN < min_role_chars:
            continue
        train, test = split_windows(all_starts[::stride])
        if len(train) and len(test):
            usable.append((len(all_starts), role, train, test))
    usable.sort(key=lambda item: (-item[0], item[1].name))
    if not usable:
        raise DataError(f"no role in {source} has {min_role_chars:,} characters of dialogue (and train and test "
                        f"windows at stride {stride}); pass --data-dir pointing at more text")
    if len(usable) < num_clients:
        raise DataError(f"only {len(usable)} roles in {source} have at least {min_role_chars:,} characters of "
                        f"dialogue (and train and test windows at stride {stride}); pass --clients {len(usable)} "
                        "or fewer, or --data-dir pointing at more text")
    kept = usable[:num_clients]
    pieces, client_starts, test_starts, offset = [], [], [], 0
    for _, role, train, test in kept:
        pieces.append(role.symbols)
        client_starts.append(torch.from_numpy(train + offset))
        test_starts.append(torch.from_numpy(test + offset))
        offset += len(role.symbols)
    logger.info("Shakespeare: %d of %d roles from %s, %d train and %d test windows", len(kept), len(roles), source,
                sum(len(t) for t in client_starts), sum(len(t) for t in test_starts))
    return TextFederatedDataset("shakespeare", "shakespeare", len(VOCAB), torch.from_numpy(np.concatenate(pieces)),
                                client_starts, torch.cat(test_starts), [role.name for _, role, _, _ in kept],
                                SEQ_LEN, recommended_batch_size=RECOMMENDED_BATCH_SIZE)


@register_dataset("shakespeare")
class ShakespeareDataset(Dataset):
    """Shakespeare, one client per speaking role."""

    model = "shakespeare"
    defaults = dict(rounds=200, local_epochs=1, lr=0.1, clip_norm=5.0, batch_size=10)

    def load(self, config) -> FederatedDataset:
        return load_shakespeare(config.clients, config.data_dir, config.download)
