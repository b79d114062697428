"""Numbers for people: a metric's value with its unit and a sensible precision.

rowgate's metric names carry their unit as a suffix (`wall_s`, `sm_clock_max_mhz`,
`temperature_max_c`, `eos_rate`, `recoverable_idle_fraction`, `bytes_per_s`) or
say what they are (`tok_s_…` is output tokens per second, `…ratio…` a
candidate/oracle ratio, `p_value` a probability). `metric(name, value)` reads the
last dotted part of the name (trace metrics are `oracle.graph.idle_fraction`) and
formats by it; a name it does not recognise gets 4 significant digits. The
sealed value is never changed: this is display only, and JSON output keeps the
raw numbers.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime

SIGNIFICANT = 4
MISSING = "—"


def number(value: float, digits: int = SIGNIFICANT) -> str:
    """At most `digits` significant digits, trailing zeros dropped (`0.3`, `20.38`,
    `1235`); scientific notation only below 1e-3 or from 1e7 on."""
    if value == 0 or not math.isfinite(value):
        return f"{value:g}" if value else "0"
    magnitude = abs(value)
    if magnitude < 1e-3 or magnitude >= 1e7:
        return f"{value:.{digits - 1}e}"
    decimals = max(0, digits - 1 - math.floor(math.log10(magnitude)))
    text = f"{value:.{decimals}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def duration(seconds: float) -> str:
    """A duration in the unit that keeps it between 1 and 1000: `6.467 ms`, `1.20 s`."""
    magnitude = abs(seconds)
    for scale, unit in ((1.0, "s"), (1e-3, "ms"), (1e-6, "µs"), (1e-9, "ns")):
        if magnitude >= scale or scale == 1e-9:
            return f"{number(seconds / scale)} {unit}"
    return f"{number(seconds)} s"  # pragma: no cover - the loop always returns


def rate_per_s(value: float, unit: str) -> str:
    for scale, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= scale:
            return f"{number(value / scale)} {prefix}{unit}/s"
    return f"{number(value)} {unit}/s"


def _parts(name: str) -> list[str]:
    """The words of the last dotted part: `oracle.graph.idle_fraction` -> [idle, fraction]."""
    return name.rsplit(".", 1)[-1].lower().split("_")


def _pair(parts: list[str], a: str, b: str) -> bool:
    return any(x == a and y == b for x, y in zip(parts, parts[1:]))


def metric(name: str, value: object) -> str:
    """One metric value as a person reads it (see the module docstring)."""
    if value is None or value == "":
        return MISSING
    if isinstance(value, bool):
        return "yes" if value else "no"
    if not isinstance(value, int | float):
        return str(value)
    parts = _parts(name)
    unit = _unit(parts)
    if isinstance(value, int) and unit in ("", "ratio", "p", "percent"):
        return str(value)  # counts, and exact values such as a 0/1 ratio threshold
    v = float(value)
    if unit == "timestamp":
        return datetime.fromtimestamp(v, UTC).isoformat(timespec="seconds")
    if unit == "tok/s":
        return f"{number(v)} tok/s"
    if unit == "B/s":
        return rate_per_s(v, "B")
    if unit == "ratio":
        return f"{number(v, 3)}×"
    if unit == "p":
        return number(v, 2)
    if unit == "percent":
        return f"{number(100 * v, 3)} %"
    if unit in ("s", "ms", "us"):
        return duration(v * {"s": 1.0, "ms": 1e-3, "us": 1e-6}[unit])
    if unit == "MHz":
        return f"{number(v)} MHz"
    if unit == "°C":
        return f"{number(v, 3)} °C"
    return number(v)


def _unit(parts: list[str]) -> str:
    """What a metric's words say its unit is ('' for a plain number)."""
    if "unix" in parts:
        return "timestamp"
    if _pair(parts, "tok", "s"):
        return "tok/s"
    if _pair(parts, "per", "s") and "bytes" in parts:
        return "B/s"
    if "ratio" in parts:
        return "ratio"
    if _pair(parts, "p", "value"):
        return "p"
    if parts[-1] in ("rate", "fraction", "spread") or parts in (["agreement"], ["accuracy"]):
        return "percent"
    if parts[-1] in ("s", "ms", "us"):
        return parts[-1]
    if "s" in parts[1:]:  # `itl_s_p99`: seconds, then a statistic
        return "s"
    if parts[-1] == "mhz":
        return "MHz"
    if parts[-1] == "c" and "temperature" in parts:
        return "°C"
    return ""
