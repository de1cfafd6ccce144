"""Durations as people write them: ``30d``, ``12h``, ``1d12h``, ``90m``, ``45s``, ``2w``."""

from __future__ import annotations

import re

from toren.errors import InvalidInput

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_DURATION = re.compile(r"(\d+(?:\.\d+)?)([smhdw])")


def parse_duration(text: str) -> float:
    """Seconds in ``30d``, ``12h``, ``1d12h``, ``90m``, ``45s`` or ``2w`` (or a bare
    number of seconds)."""
    raw = text.strip().lower()
    try:
        seconds = float(raw)
    except ValueError:
        parts = _DURATION.findall(raw)
        if not parts or "".join(n + u for n, u in parts) != raw:
            raise InvalidInput(
                f"bad duration {text!r}: expected a number with a unit, such as 30d, 12h, "
                "1d12h, 90m, 45s or 2w"
            ) from None
        seconds = sum(float(n) * _UNITS[u] for n, u in parts)
    if seconds < 0:
        raise InvalidInput(f"bad duration {text!r}: it must not be negative")
    return seconds


__all__ = ["parse_duration"]
