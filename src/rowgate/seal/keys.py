"""Key files parsed as the key they must be (`cryptography`; no crypto by hand).

A key a user hands rowgate is untrusted input (docs/security.md): `--key` must be an
ECDSA P-256 *public* key — a private key there is refused and never copied anywhere —
and the signing key an unencrypted ECDSA P-256 private key. Anything else is a
configuration error (`KeyFileError`, exit 2) in one line naming the argument.

A key's fingerprint is over the key, not its file: SHA-256 of its SubjectPublicKeyInfo
in the canonical PEM encoding (a pure function of the DER), which is also the digest
model-signing stores as a signature's key hint — so CRLF line ends or a missing final
newline do not change it, and a signature names its key without the key at hand.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from rowgate.errors import KeyFileError
from rowgate.storage import read_regular

_CURVES = {"secp256r1": "ECDSA P-256", "secp384r1": "ECDSA P-384", "secp521r1": "ECDSA P-521"}


def _describe(key: Any) -> str:
    from cryptography.hazmat.primitives.asymmetric import ec, rsa

    if isinstance(key, (ec.EllipticCurvePrivateKey, ec.EllipticCurvePublicKey)):
        return _CURVES.get(key.curve.name, f"ECDSA {key.curve.name}")
    if isinstance(key, (rsa.RSAPrivateKey, rsa.RSAPublicKey)):
        return f"RSA {key.key_size}"
    return type(key).__name__


def _p256(key: Any) -> bool:
    from cryptography.hazmat.primitives.asymmetric import ec

    return isinstance(key, (ec.EllipticCurvePrivateKey, ec.EllipticCurvePublicKey)) and \
        key.curve.name == "secp256r1"


def canonical_public_pem(public_key: Any) -> bytes:
    from cryptography.hazmat.primitives import serialization

    pem: bytes = public_key.public_bytes(serialization.Encoding.PEM,
                                         serialization.PublicFormat.SubjectPublicKeyInfo)
    return pem


def fingerprint(public_pem: bytes) -> str:
    """`sha256:HEX` of a canonical public key PEM (see the module docstring)."""
    return "sha256:" + hashlib.sha256(public_pem).hexdigest()


def public_key(path: Path, label: str) -> bytes:
    """The canonical PEM of the ECDSA P-256 public key in `path`; KeyFileError naming
    `label` (`--key PATH`) for anything else, a private key first of all."""
    return parse_public(read_regular(path, label), label)


def parse_public(data: bytes, label: str) -> bytes:
    """`public_key` on bytes already read (a PEM carried in a record)."""
    from cryptography.exceptions import UnsupportedAlgorithm
    from cryptography.hazmat.primitives import serialization

    if b"PRIVATE KEY" in data:
        raise KeyFileError(f"{label}: a private key; give the public key of the signer "
                           f"(PEM SubjectPublicKeyInfo), never the private one")
    try:
        key = serialization.load_pem_public_key(data)
    except (ValueError, TypeError, UnsupportedAlgorithm) as exc:
        raise KeyFileError(f"{label}: not a PEM public key") from exc
    if not _p256(key):
        raise KeyFileError(f"{label}: an {_describe(key)} public key; rowgate keys are ECDSA P-256")
    return canonical_public_pem(key)


def private_key(path: Path, label: str) -> Any:
    """The unencrypted ECDSA P-256 private key in `path`; KeyFileError naming `label`
    (`ROWGATE_SIGNING_KEY=PATH`) for anything else."""
    from cryptography.exceptions import UnsupportedAlgorithm
    from cryptography.hazmat.primitives import serialization

    data = read_regular(path, label)
    if b"PUBLIC KEY" in data and b"PRIVATE KEY" not in data:
        raise KeyFileError(f"{label}: a public key; signing needs the private key (PEM)")
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except TypeError as exc:  # "Password was not given but private key is encrypted"
        raise KeyFileError(f"{label}: an encrypted private key; rowgate needs an unencrypted "
                           f"one (keep the file readable by you only)") from exc
    except (ValueError, UnsupportedAlgorithm) as exc:
        raise KeyFileError(f"{label}: not a PEM private key") from exc
    if not _p256(key):
        raise KeyFileError(f"{label}: an {_describe(key)} private key; rowgate signs with "
                           f"ECDSA P-256")
    return key
