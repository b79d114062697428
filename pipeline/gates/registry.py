"""The gate kinds, registered once where each is defined (cf. nox's `registry.py`).

A gate module defines its spec model and its `Gate` subclass and decorates the class
with `@register`; importing the module registers the kind. `pipeline.gates` imports
rowgate's own kinds. Everything that needs a kind's facts asks here: the row model
(which spec a [[gates]] table validates as, which kinds' cells are the workload
matrix), the runner (which class runs it, whether the device is checked first), the
report (which view) and `rowgate rows`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypeVar, get_args

if TYPE_CHECKING:
    from pipeline.gates.interface import Gate

G = TypeVar("G", bound="type[Gate[Any]]")

KINDS: dict[str, type[Gate[Any]]] = {}
"""kind -> Gate class, in the order registered."""


def register(gate: G) -> G:
    """Class decorator: register `gate` under its `kind`. Its spec model's `kind` must be
    the literal of that same name; a kind is registered once (a module imported again
    under the same name may register its class again)."""
    tag = get_args(gate.spec_model.model_fields["kind"].annotation)
    if tag != (gate.kind,):
        raise TypeError(f"gate {gate.__qualname__}: spec {gate.spec_model.__name__} has kind "
                        f"{tag}, the gate says {gate.kind!r}")
    known = KINDS.get(gate.kind)
    if known is not None and (known.__module__, known.__qualname__) != \
            (gate.__module__, gate.__qualname__):
        raise ValueError(f"gate kind {gate.kind!r} is registered twice: "
                         f"{known.__module__}.{known.__qualname__} and "
                         f"{gate.__module__}.{gate.__qualname__}")
    KINDS[gate.kind] = gate
    return gate


def lookup(kind: str) -> type[Gate[Any]] | None:
    return KINDS.get(kind)
