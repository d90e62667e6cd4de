"""Who the clients are, as the run configuration states it: the width ladder their capacities p^max come from
(``widths``, ``width_mix``, ``width_assignment``) and the label partition of their data (``partition``).

It sits at the bottom of the package beside the run configuration and imports nothing of hasfl_ray but its errors:
the configuration validates with it, the engine draws capacities from it (the seeded streams are the engine's) and
the image loaders split their data by the partition it parses (:mod:`hasfl_ray.data.partition`).

**The ladder.** A run's capacities are one ladder: widths w_1 < ... < w_L in (0, 1] and relative shares s_1..s_L of
the clients. The paper's tiers are the default ladder, widths 0.25/0.5/0.75/1.0 with shares 0.40/0.25/0.20/0.15.
``width_mix`` takes shares (a list, or a comma string ``1,1,1,1,1``) or HeteroFL's notation ``a1-b1-c1-d1-e1``: a
level letter a-e (widths 1, 1/2, 1/4, 1/8, 1/16) followed by its share, levels joined by ``-``, which names the
widths as well.

**The global model's width.** HeteroFL trains a global model of its row's first level (``global_model_rate``: row
``b1-e1`` trains a width-1/2 network, ``src/utils.py::process_control``). ``global_width`` (a number in (0, 1], or
``first``: the first level of ``width_mix``'s notation) is that width: the ladder's widths stay widths of the full
network, and a client of width r trains the width-r/g slice of the global model (HeteroFL's
``scaler_rate = model_rate / global_model_rate``, ``src/fed.py::split_model``), which :func:`ladder_of` returns.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, List, Optional, Sequence, Tuple

import numpy as np

from hasfl_ray.errors import ConfigError

#: The paper's capacity tiers p^max and their probabilities: constrained devices are more prevalent, mean 0.525.
PAPER_WIDTHS = (0.25, 0.5, 0.75, 1.0)
PAPER_SHARES = (0.40, 0.25, 0.20, 0.15)

#: HeteroFL's width levels (Diao et al. 2021): a = 1, b = 1/2, c = 1/4, d = 1/8, e = 1/16.
HETEROFL_LEVELS = {"a": 1.0, "b": 0.5, "c": 0.25, "d": 0.125, "e": 0.0625}

#: How a client's capacity is assigned: once for the run (fixed) or redrawn from the mix every round (dynamic).
WIDTH_ASSIGNMENTS = ("fixed", "dynamic")

_NUMBER = r"(?:\d+(?:\.\d*)?|\.\d+)"
_HETEROFL = re.compile(rf"[a-e]{_NUMBER}(?:-[a-e]{_NUMBER})*")
_SHARES = re.compile(rf"\s*{_NUMBER}\s*(?:,\s*{_NUMBER}\s*)*")

_MIX_EXPECTED = ("shares of the clients, one per width (e.g. 1,1,1,1,1), or HeteroFL's notation such as "
                 "a1-b1-c1-d1-e1 (levels a-e = widths 1, 1/2, 1/4, 1/8, 1/16, each followed by its share)")


@dataclass(frozen=True)
class WidthLadder:
    """Widths (distinct, in (0, 1], in the order given: it fixes which clients a seed deals each width) and each
    width's share of the clients (>= 0, not all 0)."""

    widths: Tuple[float, ...] = PAPER_WIDTHS
    shares: Tuple[float, ...] = PAPER_SHARES

    @property
    def probabilities(self) -> Tuple[float, ...]:
        """The shares normalised to sum 1 (the paper's ladder: its probabilities exactly, 0.40/0.25/0.20/0.15)."""
        if (self.widths, self.shares) == (PAPER_WIDTHS, PAPER_SHARES):
            return PAPER_SHARES
        total = float(sum(self.shares))
        return tuple(float(s) / total for s in self.shares)

    def draw(self, num_clients: int, rng: np.random.Generator) -> np.ndarray:
        """Dynamic assignment: every client's capacity drawn independently from the mix (HeteroFL's "dynamic"), one
        categorical draw of ``rng`` per client; float64 (num_clients,)."""
        index = rng.choice(len(self.widths), size=num_clients, p=np.asarray(self.probabilities, dtype=np.float64))
        return np.asarray(self.widths, dtype=np.float64)[index]


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:40] + f"... ({len(text)} characters)"


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def parse_width_mix(mix: Any) -> Tuple[Optional[List[float]], List[float]]:
    """(the widths HeteroFL's notation names, or None for plain shares; the shares) of a ``width_mix`` value: a list
    of numbers, a comma string of them, or HeteroFL's ``a1-b1-c1-d1-e1``; one sentence otherwise."""
    if isinstance(mix, str):
        text = mix.strip()
        if _HETEROFL.fullmatch(text):
            levels = [(part[0], float(part[1:])) for part in text.split("-")]
            letters = [letter for letter, _ in levels]
            if len(set(letters)) != len(letters):
                raise ConfigError(f"width_mix is {_shown(mix)}, which names a level twice; expected each of the "
                                  "levels a-e at most once, e.g. a1-b1-c1-d1-e1")
            return [HETEROFL_LEVELS[letter] for letter in letters], [share for _, share in levels]
        if _SHARES.fullmatch(text):
            return None, [float(s) for s in text.split(",")]
        raise ConfigError(f"width_mix is {_shown(mix)}; expected {_MIX_EXPECTED}")
    if isinstance(mix, (list, tuple)) and mix and all(_finite(s) for s in mix):
        return None, [float(s) for s in mix]
    raise ConfigError(f"width_mix is {_shown(mix)}; expected {_MIX_EXPECTED}")


def normalise_ladder(widths: Any, mix: Any) -> Tuple[Optional[List[float]], Optional[List[float]]]:
    """The config's ``widths`` and ``width_mix`` checked and normalised: (widths as floats, in the order given, or
    None: the paper's; shares as floats in the widths' order, or None: equal shares). HeteroFL's notation sets the
    widths too (in its order, or in the order of ``widths`` when both are given). One sentence for a width outside
    (0, 1], a width given twice, a mix of another length than the widths, a negative share or shares adding up to
    0, bad notation, or HeteroFL's notation naming other widths than ``widths``."""
    given = widths
    if widths is not None:
        if not isinstance(widths, (list, tuple)) or not widths or not all(
                _finite(w) and 0 < w <= 1 for w in widths):
            raise ConfigError(f"widths is {_shown(widths)}; expected a list of widths in (0, 1], e.g. "
                              "[1, 0.5, 0.25, 0.125, 0.0625]")
        if len({float(w) for w in widths}) != len(widths):
            raise ConfigError(f"widths is {_shown(widths)}, which gives a width twice; expected distinct widths")
        widths = [float(w) for w in widths]
    if mix is None:
        return widths, None
    named, shares = parse_width_mix(mix)
    if named is not None:
        if widths is not None and sorted(widths) != sorted(named):
            raise ConfigError(f"width_mix is {_shown(mix)}, whose levels are the widths {named}, but widths is "
                              f"{_shown(given)}; expected the widths once (HeteroFL's notation names them)")
        if widths is not None:
            shares = [shares[named.index(w)] for w in widths]
        widths = named if widths is None else widths
    count = len(widths if widths is not None else PAPER_WIDTHS)
    if len(shares) != count:
        raise ConfigError(f"width_mix is {_shown(mix)}, {len(shares)} shares for {count} widths "
                          f"{widths if widths is not None else list(PAPER_WIDTHS)}; expected {count} shares, one "
                          "per width")
    if not all(_finite(s) and s >= 0 for s in shares) or not sum(shares) > 0:
        raise ConfigError(f"width_mix is {_shown(mix)}; expected shares >= 0, not all 0, one per width")
    return widths, shares


def global_width_of(global_width: Any, widths: Any, mix: Any) -> float:
    """The global model's width g in (0, 1] of a config's ``global_width`` (a number, or ``first``: the rate of
    ``width_mix``'s first level in HeteroFL's notation, its ``global_model_rate``; refused without one), checked
    against the ladder (``widths``, ``width_mix``): every width of it at most g. One sentence otherwise."""
    if global_width is None:
        return 1.0
    if isinstance(global_width, str) and global_width.strip() == "first":
        named, _ = parse_width_mix(mix) if mix is not None else (None, None)
        if named is None:  # no levels named (no width_mix, or plain numbers): no first level to read
            raise ConfigError(f"global_width is 'first' but width_mix is {'unset' if mix is None else _shown(mix)}; "
                              "expected width_mix in HeteroFL's notation (e.g. b1-e1), whose first level is the "
                              "global model's width")
        g = named[0]
    elif _finite(global_width) and 0 < global_width <= 1:
        g = float(global_width)
    else:
        raise ConfigError(f"global_width is {_shown(global_width)}; expected a width in (0, 1] or first (the first "
                          "level of width_mix, HeteroFL's global model rate)")
    if g < 1:
        ladder, _ = normalise_ladder(widths, mix)
        ladder = list(PAPER_WIDTHS) if ladder is None else ladder
        wider = [w for w in ladder if w > g]
        if wider:
            raise ConfigError(f"global_width is {_shown(global_width)} (width {g:g}) but the ladder has the wider "
                              f"width{'s' if len(wider) > 1 else ''} {', '.join(f'{w:g}' for w in wider)}; expected "
                              "every width of widths or width_mix at most the global model's")
    return g


def ladder_of(config: Any) -> WidthLadder:
    """The width ladder of a config (a RunConfig, or anything with ``widths`` and ``width_mix``, normalised):
    the paper's tiers when it sets neither. With ``global_width`` g < 1, each width w as the fraction w / g of the
    global model (module docstring)."""
    widths, shares = normalise_ladder(getattr(config, "widths", None), getattr(config, "width_mix", None))
    if widths is None and shares is None:
        return WidthLadder()
    widths = PAPER_WIDTHS if widths is None else tuple(widths)
    g = global_width_of(getattr(config, "global_width", None), getattr(config, "widths", None),
                        getattr(config, "width_mix", None))
    if g < 1:
        widths = tuple(w / g for w in widths)
    return WidthLadder(widths, (1.0,) * len(widths) if shares is None else tuple(shares))


def largest_remainder(num_clients: int, probabilities: Sequence[float]) -> np.ndarray:
    """Clients per level by largest remainder of ``probabilities * num_clients`` (the paper's 20 clients: 8/5/4/3):
    the counts a fixed assignment deals when ``tier_counts`` is unset (:func:`hasfl_ray.data.partition.tier_counts`)."""
    probs = np.asarray(probabilities, dtype=np.float64)
    exact = probs * num_clients
    counts = np.floor(exact).astype(int)
    remainder_order = np.argsort(-(exact - counts), kind="stable")
    counts[remainder_order[:num_clients - counts.sum()]] += 1
    return counts


def fewest_clients_filling(probabilities: Sequence[float], limit: int = 1000) -> Optional[int]:
    """The fewest clients whose largest-remainder counts give every level of positive share one (the paper's tiers:
    5), None past ``limit`` (a sweep asks it per cell: a share of 1e-6 would search for milliseconds each)."""
    probs = np.asarray(probabilities, dtype=np.float64)
    positive = probs > 0
    if not positive.any():
        return None
    top = min(limit, math.ceil(1 / probs[positive].min() - 1e-9))  # there every level's exact share is >= 1
    for clients in range(int(np.count_nonzero(positive)), top + 1):
        if np.all(largest_remainder(clients, probs)[positive] > 0):
            return clients
    return None


def empty_level_note(config: Any) -> Optional[str]:
    """The warning line a run (and a sweep, per cell, and ``data inspect``) gives at its start when a width of the
    ladder (the one ``widths`` or ``width_mix`` names, else the paper's default tiers) has a positive share but its
    largest-remainder rounding deals it 0 of the ``clients`` (e.g. 5 equal levels and 4 clients, or the paper's
    tiers and 3 clients: width 1 none): the run would compare something other than the ladder. None when every such
    width gets a client, with ``tier_counts`` (exact counts, a 0 asked for) or with ``width_assignment`` dynamic
    (redrawn every round). The rounding itself is left as it is (every run's params_sha256 stays the same)."""
    if getattr(config, "tier_counts", None) is not None or getattr(config, "width_assignment", "fixed") != "fixed":
        return None
    clients = getattr(config, "clients", None)
    if not isinstance(clients, int) or isinstance(clients, bool) or clients < 1:
        return None
    asked = getattr(config, "widths", None) is not None or getattr(config, "width_mix", None) is not None
    widths, shares = normalise_ladder(getattr(config, "widths", None), getattr(config, "width_mix", None))
    ladder = WidthLadder(tuple(PAPER_WIDTHS if widths is None else widths),
                         tuple(PAPER_SHARES if not asked else (1.0,) * len(widths) if shares is None else shares))
    counts = largest_remainder(clients, ladder.probabilities)
    empty = [i for i, (n, p) in enumerate(zip(counts, ladder.probabilities)) if n == 0 and p > 0]
    if not empty:
        return None
    named = ", ".join(f"{ladder.widths[i]:g} (share {100 * ladder.probabilities[i]:.3g}%)" for i in empty)
    dealt = "/".join(str(int(n)) for n in counts)
    one = len(empty) == 1
    fewest = fewest_clients_filling(ladder.probabilities)
    more = "more --clients" if fewest is None else f"--clients {fewest} (the fewest that give each width one)"
    return (f"width{'' if one else 's'} {named} of {'the ladder' if asked else 'the default tiers'} "
            f"{'gets' if one else 'get'} 0 of the {clients} client{'' if clients == 1 else 's'} by rounding (clients "
            f"per width {'/'.join(f'{w:g}' for w in ladder.widths)}: {dealt}), so the run compares "
            f"{'a ladder without it' if one else 'a ladder without them'}; expected at least one client a width: "
            f"{more}, or exact counts per width (--tier-counts, tier_counts)"
            + (" in place of width_mix" if asked else ""))


# -- label partitions ----------------------------------------------------------------------------------------------

#: The partition schemes of the image sets (``partition``): Dirichlet(alpha) label skew (the default), IID, k classes
#: per client (HeteroFL's and FedRolex's non-IID-k) and s label-sorted shards per client (McMahan et al. 2017).
PARTITION_SCHEMES = ("dirichlet", "balanced-dirichlet", "iid", "classes:K", "classes-even:K", "shards:S")

_PARTITION = re.compile(r"(dirichlet|balanced-dirichlet|iid)|(classes|classes-even|shards):(\d+)")


#: The ``flwr:`` schemes and their parameter: (name, kind of parameter or None, what it means).
FLWR_SCHEMES = {"iid": None, "dirichlet": "alpha", "pathological": "classes", "shard": "shards",
                "natural_id": "column"}

_FLWR = re.compile(r"flwr:([a-z_]+)(?::(.+))?")

FLWR_EXPECTED = ("flwr:iid, flwr:dirichlet:ALPHA, flwr:pathological:K, flwr:shard:S or flwr:natural_id:COLUMN "
                 "(docs/datasets.md)")


def is_flwr(spec: Any) -> bool:
    """Whether ``spec`` names a Flower Datasets partitioner (``flwr:...``)."""
    return isinstance(spec, str) and spec.strip().startswith("flwr:")


def parse_flwr(spec: str) -> Tuple[str, Any]:
    """(scheme, parameter) of a ``flwr:`` partition (parameter: None, a float alpha, an int K or S, a column name);
    one sentence (ConfigError) for an unknown scheme or a bad parameter."""
    text = spec.strip()
    match = _FLWR.fullmatch(text)
    if match is None or match.group(1) not in FLWR_SCHEMES:
        raise ConfigError(f"partition is {spec!r}; expected {FLWR_EXPECTED}")
    scheme, raw = match.group(1), match.group(2)
    kind = FLWR_SCHEMES[scheme]
    if kind is None:
        if raw is not None:
            raise ConfigError(f"partition is {spec!r}; expected flwr:{scheme} with no parameter")
        return scheme, None
    if raw is None or not raw.strip():
        raise ConfigError(f"partition is {spec!r}; expected flwr:{scheme}:{kind.upper()} ({FLWR_EXPECTED})")
    if kind == "column":
        return scheme, raw.strip()
    if kind == "alpha":
        try:
            alpha = float(raw)
        except ValueError:
            alpha = float("nan")
        if not math.isfinite(alpha) or alpha <= 0:
            raise ConfigError(f"partition is {spec!r}; expected flwr:dirichlet:ALPHA with ALPHA a number above 0 "
                              "(e.g. flwr:dirichlet:0.5)")
        return scheme, alpha
    if not raw.strip().isdigit() or int(raw) < 1:
        raise ConfigError(f"partition is {spec!r}; expected flwr:{scheme}:{kind[0].upper()} with "
                          f"{kind[0].upper()} a positive integer (e.g. flwr:{scheme}:2)")
    return scheme, int(raw)


def normalise_flwr(spec: str) -> str:
    """The canonical spelling of a ``flwr:`` partition (``flwr:dirichlet:0.5``)."""
    scheme, value = parse_flwr(spec)
    return f"flwr:{scheme}" if value is None else f"flwr:{scheme}:{value:g}" if isinstance(value, float) \
        else f"flwr:{scheme}:{value}"


#: The partitions that read ``alpha`` (their Dirichlet's concentration); every other scheme ignores it.
ALPHA_PARTITIONS = ("dirichlet", "balanced-dirichlet")


def parse_partition(spec: Any) -> Tuple[str, Optional[int]]:
    """(scheme, k) of a ``partition`` value: ``dirichlet``, ``iid``, ``classes:K`` (HeteroFL's and FedRolex's
    non-IID-K), ``classes-even:K`` (exactly K classes a client) or ``shards:S`` (K, S positive integers; k None for
    the first two); one sentence otherwise. A Flower Datasets partitioner (``flwr:iid``, ``flwr:dirichlet:ALPHA``,
    ..., :mod:`hasfl_ray.data.flower`) is its canonical spelling as the scheme, k None."""
    if isinstance(spec, str) and spec.strip().startswith("flwr:"):
        return normalise_flwr(spec), None
    match = _PARTITION.fullmatch(spec.strip()) if isinstance(spec, str) else None
    if match is None or (match.group(3) is not None and int(match.group(3)) < 1):
        raise ConfigError(f"partition is {_shown(spec)}; expected dirichlet (label skew of --alpha, the default), "
                          "balanced-dirichlet (FIARSE's), iid, classes:K (HeteroFL's non-IID-K, e.g. classes:2), "
                          "classes-even:K (exactly K classes "
                          "per client), flwr:... (Flower Datasets') or shards:S (S label-sorted shards per client, e.g. "
                          "shards:2)")
    if match.group(1):
        return match.group(1), None
    return match.group(2), int(match.group(3))


def normalise_partition(spec: Any) -> str:
    """The canonical spelling of a ``partition`` value (``classes:2``, ``iid``), or one sentence."""
    scheme, k = parse_partition(spec)
    return scheme if k is None else f"{scheme}:{k}"


def check_partition_applies(dataset: Any, name: str, spec: str) -> None:
    """Refuse, in one sentence, a partition other than the default for a dataset whose loader does not split
    labelled samples by ``partition`` (``Dataset.label_partitions`` False: Shakespeare's natural per-role clients,
    Synthetic's per-client generation, a plug-in that does not declare it). The default itself given is refused
    where the user's keys are known (``hasfl_ray.config.layers.check_inert_keys``): a stored config holds it."""
    if spec != "dirichlet" and not getattr(dataset, "label_partitions", False):
        raise ConfigError(f"partition is {spec!r} but dataset {name!r} has its own clients (no label partition "
                          "applies to it); expected partition left unset, or an image dataset (digits, emnist, "
                          "cifar10, cifar100)")


def shares_text(ladder: WidthLadder) -> str:
    """``0.25:40%, 0.5:25%, ...``: a ladder as a short phrase for log lines and ``data inspect``."""
    return ", ".join(f"{w:g}:{100 * p:.4g}%" for w, p in zip(ladder.widths, ladder.probabilities))


__all__ = ["HETEROFL_LEVELS", "PAPER_SHARES", "PAPER_WIDTHS", "PARTITION_SCHEMES", "WIDTH_ASSIGNMENTS", "WidthLadder",
           "check_partition_applies", "empty_level_note", "fewest_clients_filling", "global_width_of", "ladder_of",
           "largest_remainder", "normalise_ladder", "normalise_partition", "parse_partition", "parse_width_mix",
           "shares_text"]
