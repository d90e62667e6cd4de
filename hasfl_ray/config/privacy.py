"""The differential-privacy keys' checks (docs/privacy.md): dp_noise_multiplier turns DP on; the other dp_* keys
need it. One sentence each, naming the key, its value and what was expected."""

from __future__ import annotations

from typing import Any

from hasfl_ray import registry
from hasfl_ray.errors import ConfigError

DP_KEYS = ("dp_noise_multiplier", "dp_clip", "dp_adaptive_quantile", "dp_delta", "dp_epsilon", "dp_accountant")
ACCOUNTANTS = ("rdp", "pld")


def check_privacy(config: Any, bad) -> None:
    """Check the dp_* fields of a RunConfigFields (``bad(name, value, expected)`` makes the sentence)."""
    number = registry.finite_number
    z = config.dp_noise_multiplier
    if z is not None and (not number(z) or z <= 0):
        raise bad("dp_noise_multiplier", z, "a number > 0 (noise std z x clip)")
    for name, low, high, expected in (
            ("dp_clip", 0, None, "a number > 0 (the L2 clip)"),
            ("dp_adaptive_quantile", 0, 1, "a number in (0, 1)"),
            ("dp_delta", 0, 1, "a number in (0, 1)"),
            ("dp_epsilon", 0, None, "a number > 0 (the budget)")):
        value = getattr(config, name)
        if value is not None and (not number(value) or value <= low or (high is not None and value >= high)):
            raise bad(name, value, expected)
    if config.dp_accountant is not None and config.dp_accountant not in ACCOUNTANTS:
        raise bad("dp_accountant", config.dp_accountant, "rdp or pld")
    if z is None:
        given = [k for k in DP_KEYS[1:] if getattr(config, k) is not None]
        if given:
            raise ConfigError(f"{given[0]} is {getattr(config, given[0])!r} but dp_noise_multiplier is unset; "
                              "expected --dp-noise-multiplier Z (> 0) to turn differential privacy on")
        return
    try:
        import dp_accounting  # noqa: F401
    except ImportError:
        raise ConfigError(f"dp_noise_multiplier is {z!r} but the package dp-accounting is not installed; expected it "
                          "installed with the privacy extra: pip install \".[privacy]\" (or hasfl-ray[privacy])") from None


__all__ = ["ACCOUNTANTS", "DP_KEYS", "check_privacy"]
