"""The driver's half of differential privacy (docs/privacy.md): the server's settings at the start (or a resume), the
privacy cost from dp-accounting's own accountants, the metrics line's and the summary's keys, the stop at a target
epsilon.

The accountant's state is the number of DP updates applied: it is recomputed from that count (never pickled), so a
resumed run reports what an uninterrupted one reports. The sampling assumed (docs/privacy.md, "Accounting"):

* synchronous rounds with ``participation: poisson`` (``poisson_participants``: each client joins independently at
  rate q = clients_per_round / clients), either accountant: dp-accounting's ``PoissonSampledDpEvent(q,
  GaussianDpEvent(z))`` under add-or-remove-one, the sampling and relation of DP-FedAvg and Opacus: one client's
  presence moves the clipped sum by at most C, and the mean divides by the public q·N, never by who came;
* ``rdp``, synchronous rounds of fixed size: each round's participants are clients_per_round of clients drawn
  without replacement (``sample_participants``), so each update is dp-accounting's
  ``SampledWithoutReplacementDpEvent`` under the replace-one relation (Wang, Balle and Kasiviswanathan 2019), whose
  Gaussian noise multiplier is relative to the replace-one sensitivity of the clipped sum, 2C: z / 2;
* ``pld`` (dp-accounting's PLDAccountant has no fixed-size sampling event), every asynchronous run (who arrives
  in a buffer is not a uniform sample) and every run on the device clock (``devices``: availability and
  over-selection decide who is invited): no amplification, a ``GaussianDpEvent`` per server update under replace-one,
  an upper bound whatever the sampling; PLD's replace-one Gaussian takes the multiplier relative to C (it doubles the
  shift itself): z.

Adaptive clipping adds its count's Gaussian (std σ_b, replace-one sensitivity 1) to every update's event.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from typing import Any, Dict, Tuple

from hasfl_ray.errors import ConfigError

def enabled(config: Any) -> bool:
    return getattr(config, "dp_noise_multiplier", None) is not None


def delta_of(config: Any) -> float:
    """δ: dp_delta, or clients^-1.1 (McMahan et al. 2018's choice, below 1/clients)."""
    return config.dp_delta if config.dp_delta is not None else float(config.clients) ** -1.1


def accountant_of(config: Any) -> str:
    return config.dp_accountant or "rdp"


def updates_per_step(config: Any) -> int:
    """The updates one DP step averages in expectation: clients_per_round, or the asynchronous buffer (1: FedAsync)."""
    if config.mode == "async":
        return int(config.buffer_size or 1) if config.async_rule == "fedbuff" else 1
    return int(config.clients_per_round)


def count_noise(config: Any) -> float:
    """σ_b of adaptive clipping: the updates a step averages over 20 (Andrew et al.'s recommendation); 0 when fixed."""
    return updates_per_step(config) / 20.0 if config.dp_adaptive_quantile is not None else 0.0


def poisson(config: Any) -> bool:
    """Whether the run's rounds are Poisson samples (``participation: poisson``; synchronous, no device clock)."""
    return getattr(config, "participation", "fixed") == "poisson"


def releases_empty_rounds(config: Any) -> bool:
    """Whether a round without an update still applies one (the noise alone): DP under Poisson participation, whose
    mechanism releases a noised sum every round, whoever came."""
    return enabled(config) and poisson(config)


def expected_participants(config: Any) -> float:
    """q·N = clients_per_round: the expected number of participants, Poisson participation's public denominator."""
    return float(config.clients_per_round)


def amplified(config: Any) -> bool:
    """Whether each update is accounted as a uniform fixed-size sample: synchronous rounds drawn by
    ``sample_participants`` (no device clock, whose availability and over-selection decide who is invited), rdp."""
    return config.mode != "async" and config.devices is None and accountant_of(config) == "rdp"


def sampling_of(config: Any) -> str:
    """The sampling the accountant assumes, in words (summary.json's dp_sampling)."""
    if poisson(config):
        return (f"Poisson: each of {config.clients} clients independently with probability "
                f"{config.clients_per_round / config.clients:g} each round (add-or-remove-one)")
    if amplified(config):
        return (f"fixed-size: {config.clients_per_round} of {config.clients} clients without replacement each round "
                "(replace-one)")
    return "none: each server update composed as an unamplified Gaussian mechanism (replace-one, an upper bound)"


def dp_event(config: Any):
    """One DP update's dp-accounting event (module docstring)."""
    import dp_accounting

    rdp = accountant_of(config) == "rdp"
    z, sigma_b = config.dp_noise_multiplier, count_noise(config)
    if poisson(config):  # add-or-remove: sensitivity C for the sum, 1 for the count; the two Gaussians (one client
        # moves both) are one Gaussian of multiplier (z^-2 + σ_b^-2)^-1/2, the form both accountants sample
        inverse = z ** -2 + (sigma_b ** -2 if sigma_b else 0.0)
        q = config.clients_per_round / config.clients
        return dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(inverse ** -0.5))
    if rdp:  # multipliers relative to the replace-one sensitivity: 2C for the sum, 1 for the count
        parts = [dp_accounting.GaussianDpEvent(z / 2)] + ([dp_accounting.GaussianDpEvent(sigma_b)] if sigma_b else [])
        event = parts[0] if len(parts) == 1 else dp_accounting.ComposedDpEvent(parts)
        if amplified(config):
            event = dp_accounting.SampledWithoutReplacementDpEvent(config.clients, config.clients_per_round, event)
        return event
    # PLD: relative to half the replace-one shift (C for the sum, 1/2 for the count); two Gaussians compose exactly
    # into one Gaussian of multiplier (z^-2 + (2 σ_b)^-2)^-1/2, which PLD computes at once for any count
    inverse = z ** -2 + ((2 * sigma_b) ** -2 if sigma_b else 0.0)
    return dp_accounting.GaussianDpEvent(inverse ** -0.5)


def epsilon(config: Any, updates: int) -> float:
    """ε at δ after ``updates`` DP updates, from dp-accounting's RdpAccountant or PLDAccountant (0 before any)."""
    if updates <= 0:
        return 0.0
    key = (config.dp_noise_multiplier, config.dp_adaptive_quantile is not None, updates_per_step(config),
           config.clients, config.clients_per_round, amplified(config), poisson(config), accountant_of(config),
           delta_of(config))
    return _epsilon(key, config, updates)


@functools.lru_cache(maxsize=64)
def _epsilon_cached(key: Tuple, updates: int, config_ref: Any) -> float:
    config = config_ref.config
    from dp_accounting import pld, rdp

    if accountant_of(config) == "rdp":  # one update's RDP, times the count: what compose(event, count) adds up
        orders, one = _rdp_of_one(config_ref)
        if one is not None:
            return float(rdp.rdp_privacy_accountant.compute_epsilon(orders, updates * one, delta_of(config))[0])
        accountant = rdp.RdpAccountant(neighboring_relation=_relation(config))
    else:
        accountant = pld.PLDAccountant(neighboring_relation=_relation(config))
    with _quiet_orders():
        accountant.compose(dp_event(config), updates)
    return float(accountant.get_epsilon(delta_of(config)))


@contextlib.contextmanager
def _quiet_orders():
    """dp-accounting's RDP of a Poisson sample logs a warning for each fractional order whose series it drops (it
    leaves the order out of the minimum, which stays a valid bound): not the user's concern, so not on their
    console."""
    absl = logging.getLogger("absl")
    level = absl.level
    absl.setLevel(logging.ERROR)
    try:
        yield
    finally:
        absl.setLevel(level)


def _relation(config: Any):
    """Add-or-remove-one for a Poisson sample, replace-one otherwise (module docstring)."""
    import dp_accounting

    relation = dp_accounting.NeighboringRelation
    return relation.ADD_OR_REMOVE_ONE if poisson(config) else relation.REPLACE_ONE


@functools.lru_cache(maxsize=16)
def _rdp_of_one(config_ref: Any):
    """(orders, the RDP of one update) from an RdpAccountant that composed one event: the per-round cost of the
    sampled-without-replacement RDP is paid once per run; (None, None) where the accountant keeps them elsewhere."""
    from dp_accounting import rdp

    accountant = rdp.RdpAccountant(neighboring_relation=_relation(config_ref.config))
    with _quiet_orders():
        accountant.compose(dp_event(config_ref.config), 1)
    orders, one = getattr(accountant, "_orders", None), getattr(accountant, "_rdp", None)
    return (orders, one) if orders is not None and one is not None else (None, None)


class _Ref:
    """The config behind a cache key (the key alone decides the value; the config is not hashed)."""

    def __init__(self, key: Tuple, config: Any):
        self.key, self.config = key, config

    def __hash__(self) -> int:
        return hash(self.key)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Ref) and other.key == self.key


def _epsilon(key: Tuple, config: Any, updates: int) -> float:
    return _epsilon_cached(key, updates, _Ref(key, config))


def settings(config: Any, history) -> Any:
    """The server's :class:`~hasfl_ray.aggregation.privacy.PrivacySettings` after the rounds of ``history``: its
    update count and clip from the last line that applied one (the adaptive rule's next clip recomputed from it)."""
    from hasfl_ray.aggregation.privacy import PrivacySettings, next_clip

    clip = config.dp_clip if config.dp_clip is not None else 1.0
    done = 0
    for line in reversed(history):
        if line.get("dp_clip") is not None and line.get("dp_updates"):
            done, clip = int(line["dp_updates"]), float(line["dp_clip"])
            if config.dp_adaptive_quantile is not None:
                clip = next_clip(clip, float(line["dp_unclipped_noised"]), config.dp_adaptive_quantile)
            break
    return PrivacySettings(noise_multiplier=float(config.dp_noise_multiplier), clip=clip, seed=int(config.seed),
                           updates=done, quantile=config.dp_adaptive_quantile, count_noise=count_noise(config),
                           expected=expected_participants(config) if poisson(config) else None)


def check_budget(engine: Any) -> None:
    """Refuse (one sentence, while the run is prepared) a budget the next update would already exceed."""
    c = engine.config
    if not enabled(c):
        return
    state = settings(c, engine.history)
    if c.dp_epsilon is not None and epsilon(c, state.updates + 1) > c.dp_epsilon:
        raise ConfigError(f"dp_epsilon is {c.dp_epsilon!r} but {'one more' if state.updates else 'a single'} update "
                          f"would reach epsilon {epsilon(c, state.updates + 1):.4g} at delta {delta_of(c):.3g} "
                          f"(noise multiplier {c.dp_noise_multiplier!r}); expected a larger budget or more noise")


def start(engine: Any) -> None:
    """At the start of a run (or a resume): the server's settings (its update count and clip those of the rounds
    run so far). Nothing without DP."""
    engine.dp_updates = None
    c = engine.config
    if not enabled(c):
        return
    state = settings(c, engine.history)
    engine.dp_updates = state.updates
    engine.stopping = engine.stopping or c.dp_epsilon is not None  # each line recorded before the next round
    engine.backend.set_privacy(state)


def line_keys(engine: Any, t: int, aggregate: Any) -> Dict[str, Any]:
    """The round's (or server update's) DP keys: dp_epsilon after it, dp_updates, dp_clip, dp_clipped (and
    dp_unclipped_noised with adaptive clipping); none without DP. Asks the run to stop when the next update would
    take ε past dp_epsilon."""
    c = engine.config
    if not enabled(c):
        return {}
    keys: Dict[str, Any] = dict(aggregate.privacy or {})
    engine.dp_updates = int(keys.get("dp_updates", engine.dp_updates or 0))
    keys["dp_updates"] = engine.dp_updates
    keys["dp_epsilon"] = epsilon(c, engine.dp_updates)
    if c.dp_epsilon is not None and engine.stopped_early is None and \
            epsilon(c, engine.dp_updates + 1) > c.dp_epsilon:
        engine.stopped_early = {"round": t, "reason": f"the next update would take epsilon past dp_epsilon "
                                                      f"{c.dp_epsilon:g}"}
    return keys


def summary_keys(engine: Any) -> Dict[str, Any]:
    """summary.json's DP keys (none without DP)."""
    c = engine.config
    if not enabled(c):
        return {}
    updates = int(getattr(engine, "dp_updates", None) or 0)
    return {"dp_epsilon": epsilon(c, updates), "dp_delta": delta_of(c), "dp_updates": updates,
            "dp_accountant": accountant_of(c), "dp_sampling": sampling_of(c),
            "dp_noise_multiplier": c.dp_noise_multiplier}


__all__ = ["accountant_of", "delta_of", "dp_event", "enabled", "epsilon", "expected_participants", "line_keys",
           "poisson", "releases_empty_rounds", "sampling_of",
           "settings", "start", "summary_keys", "check_budget"]
