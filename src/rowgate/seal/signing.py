"""Signers and verifiers for evidence bundles, reviews and attestations.

All cryptography is Sigstore's `model-signing` (a directory signed into an
in-toto Statement v1 inside a Sigstore bundle v0.3, one resource per file) and
`cryptography` for key generation. There is no unsigned mode.

Backends:
* `sigstore`: keyless, chosen automatically when an ambient OIDC credential is
  detected (e.g. a runner job with `id-token: write`);
* `key`: ECDSA P-256 from `ROWGATE_SIGNING_KEY` (PEM path), else a key created
  on first use under the user's config dir (announced on stderr).
"""

from __future__ import annotations

import abc
import base64
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from rowgate.errors import KeyFileError, SigningError, UsageError, VerificationError
from rowgate.records.canonical import strict_loads
from rowgate.records.identity import SignerIdentity
from rowgate.seal import keys
from rowgate.storage import is_storage, write_atomic

if TYPE_CHECKING:
    from model_signing import hashing
    from model_signing._signing import signing as ms_signing

SIGNATURE_FILE = "signature.sigstore.json"
KEY_ENV = "ROWGATE_SIGNING_KEY"


def config_dir() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "rowgate"


def _hashing_config(ignore: list[str]) -> hashing.Config:
    from model_signing import hashing

    # max_workers=None lets model-signing hash files in parallel threads;
    # hashlib releases the GIL, so this scales with cores.
    config = hashing.Config()  # type: ignore[no-untyped-call]  # model-signing: untyped __init__
    return config.use_file_serialization(
        hashing_algorithm="sha256", allow_symlinks=False,
        ignore_paths=[Path(p) for p in ignore])


# ------------------------------------------------------------------- signers


class Signer(abc.ABC):
    identity: SignerIdentity

    @abc.abstractmethod
    def sign(self, directory: Path, signature: Path, ignore: list[str]) -> None:
        """Sign every file under `directory` except `ignore` into `signature`.

        Raises `SigningError`.
        """

    @abc.abstractmethod
    def verifier(self) -> "Verifier":
        """A verifier that accepts exactly this signer's signatures."""


class KeySigner(Signer):
    def __init__(self, private_key: Path, label: str | None = None):
        """`label` names the key in errors (`ROWGATE_SIGNING_KEY=PATH`); a key that is not
        an unencrypted ECDSA P-256 private key is a KeyFileError (exit 2)."""
        key = keys.private_key(private_key, label or f"signing key {private_key}")
        self.private_key = private_key
        self.public_pem = keys.canonical_public_pem(key.public_key())
        self.identity = SignerIdentity(kind="key", id=keys.fingerprint(self.public_pem))

    @classmethod
    def from_env(cls, value: str) -> KeySigner:
        """The signer `ROWGATE_SIGNING_KEY=value` names (set but empty is an error too)."""
        if not value:
            raise KeyFileError(f"{KEY_ENV}=: is empty; unset it to sign with your own key "
                               f"under {config_dir()}, or name a PEM private key")
        return cls(Path(value), label=f"{KEY_ENV}={value}")

    def verifier(self) -> "Verifier":
        return KeyVerifier(self.public_key_file())

    def public_key_file(self) -> Path:
        return public_key_file(self.public_pem)

    def sign(self, directory: Path, signature: Path, ignore: list[str]) -> None:
        from model_signing import signing

        try:
            (signing.Config()  # type: ignore[no-untyped-call]  # model-signing: untyped __init__
             .set_hashing_config(_hashing_config(ignore))
             .use_elliptic_key_signer(private_key=self.private_key)
             .sign(directory, signature))
        except (OSError, ValueError) as exc:
            if is_storage(exc):
                raise  # a full disk is the caller's StorageError, not a signing failure
            raise SigningError(f"signing {directory} with key {self.identity.id} failed") from exc


class SigstoreSigner(Signer):
    """Keyless signing with an ambient OIDC token (Fulcio certificate + Rekor)."""

    def __init__(self, token: str):
        from sigstore.oidc import IdentityToken

        self._token = IdentityToken(token)
        self.identity = SignerIdentity(kind="sigstore", id=self._token.identity,
                                       issuer=self._token.issuer)

    def verifier(self) -> "Verifier":
        return SigstoreVerifier(self.identity.id, self.identity.issuer)

    def sign(self, directory: Path, signature: Path, ignore: list[str]) -> None:
        from model_signing import signing

        try:
            (signing.Config()  # type: ignore[no-untyped-call]  # model-signing: untyped __init__
             .set_hashing_config(_hashing_config(ignore))
             .use_sigstore_signer(identity_token=str(self._token))
             .sign(directory, signature))
        except Exception as exc:  # network/transparency-log errors have no common base
            if is_storage(exc):
                raise
            raise SigningError(f"keyless signing as {self.identity} failed") from exc


def public_key_file(public_pem: bytes) -> Path:
    """A public key PEM as a file under the user's config dir (model-signing reads
    keys from paths), named by its fingerprint."""
    name = keys.fingerprint(public_pem).removeprefix("sha256:")[:16]
    out = config_dir() / "public" / f"{name}.pub.pem"
    if not out.is_file() or out.read_bytes() != public_pem:
        write_atomic(out, public_pem)
    return out


def _to_stderr(msg: str) -> None:
    print(msg, file=sys.stderr)


def ensure_local_key(announce: Callable[[str], None] = _to_stderr) -> Path:
    """The user's rowgate key, created on first use and announced."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    key_path = config_dir() / "signing-key.pem"
    pub_path = config_dir() / "signing-key.pub.pem"
    if key_path.exists():
        return key_path
    key_path.parent.mkdir(parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP256R1())
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption())
    fd = os.open(key_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(pem)
    write_atomic(pub_path, keys.canonical_public_pem(key.public_key()))
    announce(f"rowgate: created signing key {key_path}; public key {pub_path} "
             f"(give it to reviewers: rowgate verify --key {pub_path})")
    return key_path


def local_public_key() -> Path:
    return config_dir() / "signing-key.pub.pem"


def _ambient_token() -> str | None:
    if os.environ.get("ROWGATE_SIGNER") == "key":
        return None
    try:
        from sigstore.oidc import detect_credential

        return detect_credential()
    except Exception:  # detection probes CI environments; any failure means "none"
        return None


def default_signer(announce: Callable[[str], None] = _to_stderr) -> Signer:
    """Keyless when an ambient OIDC credential exists, else the configured key."""
    token = _ambient_token()
    if token:
        return SigstoreSigner(token)
    env_key = os.environ.get(KEY_ENV)
    if env_key is not None:
        return KeySigner.from_env(env_key)
    return KeySigner(ensure_local_key(announce))


# ----------------------------------------------------------------- verifiers


class Verifier(abc.ABC):
    identity: SignerIdentity
    """Whom this verifier accepts."""

    @abc.abstractmethod
    def verify(self, directory: Path, signature: Path) -> SignerIdentity:
        """Check the signature over every file of `directory`. Raises VerificationError."""

    @abc.abstractmethod
    def signed_digests(self, signature: Path) -> dict[str, str]:
        """Check the signature alone and return the sha256 it signs for each file.

        For callers that hash the files themselves (bundles): model-signing's
        public `verify` re-hashes every file, and a bundle's files are already
        hashed once to check manifest.json — on multi-GB traces a second pass
        halves verify throughput. The cryptographic check is still model-signing's
        (its per-backend verifier classes); only the re-hash is skipped.
        Raises VerificationError.
        """


def _signed_digests(verifier: ms_signing.Verifier, signature_cls: type[ms_signing.Signature],
                    signature: Path, who: str) -> dict[str, str]:
    try:
        manifest = verifier.verify(signature_cls.read(signature))
    except Exception as exc:  # cryptography/sigstore raise unrelated exception types
        raise VerificationError(f"{SIGNATURE_FILE}: signature does not verify as {who} "
                                f"({type(exc).__name__}: {str(exc)[:120]})") from exc
    kind = manifest.serialization_type
    if kind.get("method") != "files" or kind.get("hash_type") != "sha256":
        raise VerificationError(f"{SIGNATURE_FILE}: signs {kind.get('method')}/"
                                f"{kind.get('hash_type')}, rowgate expects per-file sha256")
    return {rd.identifier: rd.digest.digest_hex for rd in manifest.resource_descriptors()}


def _model_signing_diff(exc: Exception) -> str:
    text = str(exc)
    return text.replace("Signature mismatch: ", "").replace("in model '", "in '")


class KeyVerifier(Verifier):
    def __init__(self, public_key: Path, label: str | None = None):
        """`public_key` must hold an ECDSA P-256 public key (KeyFileError naming `label`,
        default `--key PATH`, otherwise). model-signing reads the key's canonical PEM."""
        self._accept(keys.public_key(public_key, label or f"--key {public_key}"))

    @classmethod
    def of_pem(cls, pem: bytes, label: str) -> KeyVerifier:
        """A verifier for a public key PEM carried in a record (parsed the same way)."""
        verifier = cls.__new__(cls)
        verifier._accept(keys.parse_public(pem, label))
        return verifier

    def _accept(self, canonical_pem: bytes) -> None:
        self.public_pem = canonical_pem
        self.public_key = public_key_file(canonical_pem)
        self.identity = SignerIdentity(kind="key", id=keys.fingerprint(canonical_pem))

    def verify(self, directory: Path, signature: Path) -> SignerIdentity:
        from model_signing import verifying

        claimed = signature_identity(signature)
        if claimed.id != self.identity.id:
            raise VerificationError(f"{SIGNATURE_FILE}: signed by {claimed}, not by the "
                                    f"expected key {self.identity.id}")
        try:
            (verifying.Config()  # type: ignore[no-untyped-call]  # model-signing: untyped __init__
             .use_elliptic_key_verifier(public_key=self.public_key)
             .verify(directory, signature))
        except ValueError as exc:
            raise VerificationError(f"{SIGNATURE_FILE}: {_model_signing_diff(exc)}") from exc
        except Exception as exc:  # cryptography raises InvalidSignature (no ValueError base)
            raise VerificationError(f"{SIGNATURE_FILE}: signature does not verify with key "
                                    f"{self.identity.id} ({type(exc).__name__})") from exc
        return self.identity

    def signed_digests(self, signature: Path) -> dict[str, str]:
        from model_signing._signing import sign_ec_key, sign_sigstore_pb

        claimed = signature_identity(signature)
        if claimed.id != self.identity.id:
            raise VerificationError(f"{SIGNATURE_FILE}: signed by {claimed}, not by the "
                                    f"expected key {self.identity.id}")
        return _signed_digests(sign_ec_key.Verifier(self.public_key), sign_sigstore_pb.Signature,
                               signature, f"key {self.identity.id}")


class SigstoreVerifier(Verifier):
    def __init__(self, identity: str, issuer: str):
        self.identity = SignerIdentity(kind="sigstore", id=identity, issuer=issuer)

    def verify(self, directory: Path, signature: Path) -> SignerIdentity:
        from model_signing import verifying

        try:
            (verifying.Config()  # type: ignore[no-untyped-call]  # model-signing: untyped __init__
             .use_sigstore_verifier(identity=self.identity.id, oidc_issuer=self.identity.issuer)
             .verify(directory, signature))
        except Exception as exc:  # sigstore raises several unrelated types
            raise VerificationError(f"{SIGNATURE_FILE}: {_model_signing_diff(exc)}") from exc
        return self.identity

    def signed_digests(self, signature: Path) -> dict[str, str]:
        from model_signing._signing import sign_sigstore

        verifier = sign_sigstore.Verifier(identity=self.identity.id,
                                          oidc_issuer=self.identity.issuer)
        return _signed_digests(verifier, sign_sigstore.Signature, signature, str(self.identity))


def signature_identity(signature: Path) -> SignerIdentity:
    """Who a signature claims to be from, read without verifying it."""
    try:
        data = signature.read_bytes()
    except OSError as exc:
        raise VerificationError(f"{SIGNATURE_FILE}: cannot read ({exc.strerror})") from exc
    doc = strict_loads(data, SIGNATURE_FILE)  # one key hint, one certificate: one reading
    try:
        material = doc["verificationMaterial"]
    except (KeyError, TypeError) as exc:
        raise VerificationError(f"{SIGNATURE_FILE}: not a Sigstore bundle") from exc
    if "publicKey" in material:
        return SignerIdentity(kind="key", id="sha256:" + material["publicKey"].get("hint", "?"))
    cert = material.get("certificate", {}).get("rawBytes") or (
        material.get("x509CertificateChain", {}).get("certificates", [{}])[0].get("rawBytes"))
    if not cert:
        raise VerificationError(f"{SIGNATURE_FILE}: no key hint and no certificate")
    return _certificate_identity(base64.b64decode(cert))


def _certificate_identity(der: bytes) -> SignerIdentity:
    from cryptography import x509

    cert = x509.load_der_x509_certificate(der)
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    names = san.get_values_for_type(x509.RFC822Name) or san.get_values_for_type(
        x509.UniformResourceIdentifier)
    issuer = ""
    for ext in cert.extensions:  # Fulcio's OIDC issuer extensions (v2 then v1)
        if ext.oid.dotted_string in ("1.3.6.1.4.1.57264.1.8", "1.3.6.1.4.1.57264.1.1"):
            raw = ext.value.value
            issuer = raw[2:].decode() if raw[:1] == b"\x0c" else raw.decode(errors="replace")
            break
    return SignerIdentity(kind="sigstore", id=names[0] if names else "?", issuer=issuer)


def verifier_for(key: Path | None, identity: str | None, issuer: str | None,
                 signature: Path) -> Verifier:
    """The verifier a CLI invocation asks for; defaults to the local key."""
    if identity or issuer:
        if not (identity and issuer):
            raise UsageError("--identity and --issuer must be given together")
        return SigstoreVerifier(identity, issuer)
    if key is not None:
        return KeyVerifier(key)
    claimed = signature_identity(signature) if signature.exists() else None
    if claimed is not None and claimed.kind == "sigstore":
        raise UsageError(f"bundle is signed keylessly by {claimed}: pass --identity and --issuer")
    env_key = os.environ.get(KEY_ENV)
    if env_key is not None:
        return KeySigner.from_env(env_key).verifier()
    if local_public_key().exists():
        return KeyVerifier(local_public_key())
    raise UsageError("no public key to verify with: pass --key PUB.pem (or --identity/--issuer)")
