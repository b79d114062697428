"""Plugin families opened by entry points: gate kinds (`rowgate.gates`) and engines
(`rowgate.engines`), the pytest/flake8/nox pattern.

rowgate's own kinds and engines register exactly as a third party's do, in their
distribution's entry points; a name is loaded the first time something asks for it.
Objects registered in code (`register`, a test's own gate kind) stand beside them.
This module sits below everything else so that the row model can validate a gate
table through its kind without importing the gates.
"""

from __future__ import annotations

from functools import cache
from importlib.metadata import EntryPoint, entry_points
from typing import Any

GATES = "rowgate.gates"
ENGINES = "rowgate.engines"

_REGISTERED: dict[str, dict[str, Any]] = {GATES: {}, ENGINES: {}}


@cache
def _entry_points(group: str) -> dict[str, EntryPoint]:
    return {ep.name: ep for ep in entry_points(group=group)}


def names(group: str) -> list[str]:
    """Every name installed or registered in `group`, entry points first."""
    return list(dict.fromkeys([*_entry_points(group), *_REGISTERED[group]]))


def own(group: str) -> list[str]:
    """The names rowgate's own distribution provides, sorted."""
    return sorted(n for n, ep in _entry_points(group).items() if ep.value.startswith("rowgate."))


def register(group: str, name: str, obj: Any) -> None:
    _REGISTERED[group][name] = obj


def load(group: str, name: str) -> Any | None:
    """The object registered as `name`, loading its entry point once; None if unknown.
    A plugin that fails to import raises: a broken install is not an unknown name."""
    known = _REGISTERED[group].get(name)
    if known is not None:
        return known
    ep = _entry_points(group).get(name)
    if ep is None:
        return None
    obj = ep.load()
    _REGISTERED[group].setdefault(name, obj)
    return _REGISTERED[group][name]


def unknown(group: str, name: str, what: str) -> str:
    """One line for a name nothing installed provides, naming the installed ones."""
    return f"{what} {name!r} is not installed (installed: {', '.join(sorted(names(group)))})"
