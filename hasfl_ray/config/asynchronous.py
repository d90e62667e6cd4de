"""The asynchronous run mode's config keys, checked and normalised (docs/async.md): ``mode``, ``concurrency`` C,
``async_rule`` (FedBuff or FedAsync), ``buffer_size`` K, the staleness function ``staleness``, FedAsync's mixing
weight ``async_alpha`` (the server's learning rate and momentum, ``server_lr`` and ``server_momentum``, are the
server optimiser's: :mod:`hasfl_ray.config.server_optimizer`, FedBuff's defaults 1 and 0), the local proximal weight
``async_rho`` (FedAsync's ρ) and the evaluation schedule per server update (``eval_every_updates``,
``eval_every_seconds``). Pure values only; a synchronous run (the default) leaves every one of them unset."""

from __future__ import annotations

import math
import re
from typing import Any, Dict, Optional, Tuple

from hasfl_ray.errors import ConfigError
from hasfl_ray.registry import FLOAT32_MAX, finite_number

MODES = ("sync", "async")
RULES = ("fedbuff", "fedasync")
#: FedBuff's buffer when ``buffer_size`` is unset: K = min(DEFAULT_BUFFER, C) (the paper's K = 10).
DEFAULT_BUFFER = 10
#: s(τ) = (1 + τ)^-0.5 = 1/sqrt(1 + τ), FedBuff's (Nguyen et al., 2022) and FedAsync's polynomial a = 0.5.
DEFAULT_STALENESS = "polynomial:0.5"
#: FedAsync's mixing weight α (Xie et al., 2019, evaluate α in 0.1..0.9; 0.6 is among their settings).
DEFAULT_ALPHA = 0.6
#: The keys only an asynchronous run takes.
ASYNC_KEYS = ("concurrency", "async_rule", "buffer_size", "staleness", "async_alpha", "async_rho", "eval_every_updates",
              "eval_every_seconds")
#: Synchronous keys an asynchronous run cannot take: the values it accepts (their defaults; ``auto`` batching is
#: off) and what it expects instead, refused in one sentence rather than ignored.
SYNC_ONLY = {"deadline_policy": (("drop",), "it unset (a policy for late updates; an asynchronous server has no "
                                            "deadline)"),
             "client_batching": (("auto", "off"), "auto or off (each asynchronous client trains alone, from the "
                                                  "model of its dispatch)"),
             "test_every": ((1,), "1 (an asynchronous run evaluates every eval_every_updates server updates or "
                                  "eval_every_seconds simulated seconds)"),
             "test_first": ((False,), "it unset (an asynchronous run evaluates every eval_every_updates server "
                                      "updates or eval_every_seconds simulated seconds)"),
             "test_last": ((0,), "it unset (an asynchronous run evaluates every eval_every_updates server updates "
                                 "or eval_every_seconds simulated seconds)"),
             "test_phase": ((None,), "it unset (an asynchronous run evaluates every eval_every_updates server "
                                     "updates or eval_every_seconds simulated seconds)")}

STALENESS_EXPECTED = ("constant, polynomial:A (s = (1 + tau)^-A, A >= 0) or hinge:A,B (s = 1 for tau <= B, else "
                      "1 / (A (tau - B) + 1), A >= 0, B >= 0)")


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:40] + f"... ({len(text)} characters)"


def _refuse(name: str, value: Any, expected: str) -> ConfigError:
    return ConfigError(f"{name} is {_shown(value)}; expected {expected}")


def parse_staleness(text: Any) -> Tuple[str, Tuple[float, ...]]:
    """``staleness`` as (kind, parameters): ("constant", ()), ("polynomial", (a,)) or ("hinge", (a, b)); one
    sentence for anything else, a negative exponent included."""
    if not isinstance(text, str):
        raise _refuse("staleness", text, STALENESS_EXPECTED)
    match = re.fullmatch(r"\s*(constant|polynomial|hinge)\s*(?::\s*([^,]+?)\s*(?:,\s*(.+?)\s*)?)?", text)
    if match is None:
        raise _refuse("staleness", text, STALENESS_EXPECTED)
    kind, first, second = match.groups()
    try:
        values = tuple(float(v) for v in (first, second) if v is not None)
    except ValueError:
        raise _refuse("staleness", text, STALENESS_EXPECTED) from None
    wanted = {"constant": 0, "polynomial": 1, "hinge": 2}[kind]
    if len(values) != wanted or not all(math.isfinite(v) and v >= 0 for v in values):
        raise _refuse("staleness", text, STALENESS_EXPECTED)
    return kind, values


def staleness_factor(kind: str, params: Tuple[float, ...], tau: int) -> float:
    """s(τ) of a parsed staleness function: 1; (1 + τ)^-a; or 1 for τ <= b, else 1 / (a (τ − b) + 1)."""
    if kind == "constant":
        return 1.0
    if kind == "polynomial":
        return float((1.0 + tau) ** -params[0])
    a, b = params
    return 1.0 if tau <= b else float(1.0 / (a * (tau - b) + 1.0))


def _count(name: str, value: Any, expected: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise _refuse(name, value, expected)
    return value


def check_async_keys(values: Dict[str, Any], clients: int, devices: Any, deadline: Any) -> Dict[str, Any]:
    """The asynchronous keys of ``values`` checked and their defaults filled for ``mode: async`` (C = the clients
    per round, K = min(10, C), s(τ) = 1/sqrt(1 + τ), α = 0.6 with FedAsync, evaluation after every update); with
    ``mode: sync`` every one must be unset. Returns the normalised keys; one sentence for a bad value."""
    mode = values["mode"]
    if mode not in MODES:
        raise _refuse("mode", mode, "sync (rounds, the default) or async (event-driven: FedBuff or FedAsync)")
    if mode == "sync":
        for key in ASYNC_KEYS:
            if values[key] is not None:
                raise ConfigError(f"{key} is {_shown(values[key])} but mode is 'sync'; expected it only with mode "
                                  "async")
        return {}
    if devices is None:
        raise ConfigError("mode is 'async' but devices is unset; expected a device population (--devices), whose "
                          "clock says when each update arrives")
    if deadline is not None:
        raise ConfigError(f"deadline is {_shown(deadline)} but mode is 'async'; expected no deadline (an asynchronous "
                          "server waits for no round: every update arrives when its device finishes)")
    for key, (allowed, expected) in SYNC_ONLY.items():
        if values.get(key, allowed[0]) not in allowed:
            raise ConfigError(f"{key} is {_shown(values[key])} but mode is 'async', which does not take it; expected "
                              f"{expected}")
    out: Dict[str, Any] = {}
    concurrency = values["concurrency"] if values["concurrency"] is not None else values["clients_per_round"]
    out["concurrency"] = _count("concurrency", concurrency, "a positive integer (clients training at once)")
    if out["concurrency"] > clients:
        raise ConfigError(f"concurrency is {out['concurrency']} but clients is {clients}; expected at most as many "
                          "clients in flight as clients")
    rule = values["async_rule"] if values["async_rule"] is not None else "fedbuff"
    if rule not in RULES:
        raise _refuse("async_rule", rule, "fedbuff (buffer K updates) or fedasync (mix each arrival in)")
    out["async_rule"] = rule
    size = values["buffer_size"]
    if rule == "fedasync":
        if size is not None and size != 1:
            raise ConfigError(f"buffer_size is {_shown(size)} but async_rule is 'fedasync'; expected it unset or 1 "
                              "(FedAsync applies every arrival)")
        size = 1
    elif size is None:
        size = min(DEFAULT_BUFFER, out["concurrency"])
    out["buffer_size"] = _count("buffer_size", size, "a positive integer (updates buffered per server update)")
    if out["buffer_size"] > out["concurrency"]:
        raise ConfigError(f"buffer_size is {out['buffer_size']} but concurrency is {out['concurrency']}; expected at "
                          "most as many buffered updates as clients in flight")
    staleness = values["staleness"] if values["staleness"] is not None else DEFAULT_STALENESS
    kind, params = parse_staleness(staleness)
    out["staleness"] = kind if kind == "constant" else f"{kind}:{','.join(format(p, 'g') for p in params)}"
    alpha = values["async_alpha"]
    if rule == "fedbuff" and alpha is not None:
        raise ConfigError(f"async_alpha is {_shown(alpha)} but async_rule is 'fedbuff'; expected it only with fedasync "
                          "(FedBuff's step is the algorithm's server learning rate)")
    if rule == "fedasync":
        alpha = DEFAULT_ALPHA if alpha is None else alpha
        if not finite_number(alpha) or not 0 < alpha <= 1:
            raise _refuse("async_alpha", alpha, "a number in (0, 1] (FedAsync's mixing weight)")
        out["async_alpha"] = float(alpha)
    out.update(_proximal(values))
    every = values["eval_every_updates"]
    seconds = values["eval_every_seconds"]
    if seconds is not None:
        if not finite_number(seconds) or seconds <= 0:
            raise _refuse("eval_every_seconds", seconds, "a number of simulated seconds > 0")
        out["eval_every_seconds"] = float(seconds)
    if every is not None or seconds is None:
        out["eval_every_updates"] = _count("eval_every_updates", 1 if every is None else every,
                                           "a positive integer (server updates between evaluations)")
    return out


def _proximal(values: Dict[str, Any]) -> Dict[str, Any]:
    """The local proximal weight ρ (default 0) of either rule."""
    out: Dict[str, Any] = {}
    rho = 0.0 if values.get("async_rho") is None else values["async_rho"]
    if not finite_number(rho) or not 0 <= rho <= FLOAT32_MAX:
        raise _refuse("async_rho", rho, "a number >= 0 (the weight of the local proximal term rho/2 ||w - "
                                        "w_received||^2; 0: none)")
    out["async_rho"] = float(rho)
    return out


def eval_due(version: int, last: bool, time_s: float, previous_s: float, every: Optional[int],
             seconds: Optional[float]) -> bool:
    """Whether the server update ``version`` (0-based) that ended at simulated ``time_s`` (the one before it at
    ``previous_s``) is evaluated: every ``every`` updates, whenever a multiple of ``seconds`` was crossed, and the
    last update always."""
    if last:
        return True
    if every is not None and (version + 1) % every == 0:
        return True
    if seconds is None:
        return False
    now, before = float(time_s) / float(seconds), float(previous_s) / float(seconds)  # (Python floats: inf, silently)
    if not math.isfinite(now):  # seconds below time_s / 1.8e308 (5e-324): multiples far finer than time_s's own
        return time_s > previous_s  # resolution, so any later time crosses one (never an OverflowError)
    return math.floor(now) > math.floor(before)
