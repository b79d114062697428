"""Who signed a bundle or record."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict


class SignerIdentity(BaseModel):
    """Who signed: a key fingerprint, or an OIDC identity and its issuer."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["key", "sigstore"]
    id: str
    """`sha256:<hex>` of the public key PEM (the Sigstore bundle's key hint), or
    the certificate's identity (email or workflow URI)."""
    issuer: str = ""

    def __str__(self) -> str:
        return f"{self.id} ({self.issuer})" if self.issuer else self.id
