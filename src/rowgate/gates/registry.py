"""The gate kinds: entry points of group `rowgate.gates` (rowgate.plugins).

A gate module defines its spec model and its `Gate` subclass; its distribution names
the class under its kind in `[project.entry-points."rowgate.gates"]`, rowgate's own
kinds included. `register` adds a kind in code (a test's kind) with the same checks.
Everything that needs a kind's facts asks here: the runner (which class runs it,
whether the device is checked first), the report (which view) and `rowgate rows`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypeVar, get_args

from rowgate import plugins

if TYPE_CHECKING:
    from rowgate.gates.interface import Gate

G = TypeVar("G", bound="type[Gate[Any]]")


def _check(gate: type[Gate[Any]], kind: str) -> None:
    tag = get_args(gate.spec_model.model_fields["kind"].annotation)
    if tag != (gate.kind,) or gate.kind != kind:
        raise TypeError(f"gate {gate.__qualname__} (registered as {kind!r}): spec "
                        f"{gate.spec_model.__name__} has kind {tag}, the gate says {gate.kind!r}")


def register(gate: G) -> G:
    """Class decorator: register `gate` under its `kind` in code. A kind is registered
    once (a module imported again under the same name may register its class again)."""
    _check(gate, gate.kind)
    known = plugins.load(plugins.GATES, gate.kind)
    if known is not None and (known.__module__, known.__qualname__) != \
            (gate.__module__, gate.__qualname__):
        raise ValueError(f"gate kind {gate.kind!r} is registered twice: "
                         f"{known.__module__}.{known.__qualname__} and "
                         f"{gate.__module__}.{gate.__qualname__}")
    plugins.register(plugins.GATES, gate.kind, gate)
    return gate


def lookup(kind: str) -> type[Gate[Any]] | None:
    gate: type[Gate[Any]] | None = plugins.load(plugins.GATES, kind)
    if gate is not None:
        _check(gate, kind)
    return gate


def kinds() -> list[str]:
    """Every installed or registered kind."""
    return plugins.names(plugins.GATES)
