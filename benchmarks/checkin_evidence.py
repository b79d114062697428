"""Check sealed bundles into the repo, whole, with the public key that signed them.

    python benchmarks/checkin_evidence.py --key device-key.pub.pem BUNDLE [BUNDLE ...]
    python benchmarks/checkin_evidence.py --key KEY --from-device RESULTS_DIR ROW/BUNDLE-ID ...

Each BUNDLE (`…/ROW/BUNDLE-ID`) is verified with `--key` first (`rowgate verify`: a
bundle that does not verify is never checked in), then copied byte for byte to
`docs/evidence/ROW/BUNDLE-ID/`, and the key to `docs/evidence/keys/NAME-FP12.pub.pem`
(FP12 = the first 12 hex digits of the key's fingerprint, the signer id the manifest
names). `--from-device DIR` first unpacks `DIR/evidence.tar.gz.part-*` (what
`benchmarks/device_gate.sh` returns) into a temporary directory and takes the named
bundles from there. Refuses to go over `docs/evidence`'s budget (30 MB in all): traces,
SASS dumps, PTX, objects, fatbins and case records are sealed gzipped by their gates
(src/rowgate/compressed.py), so a bundle over budget is a bundle to leave out,
not to recompress (any change to a byte breaks its signature). `tests/test_evidence_checked_in.py`
verifies every checked-in bundle with its key.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from rowgate.seal import signing
from rowgate.seal.bundle import Bundle

ROOT = Path(__file__).resolve().parent.parent

EVIDENCE = ROOT / "docs" / "evidence"
BUDGET_BYTES = 30 * 1000 * 1000


def tree_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def key_file(key: Path, name: str) -> Path:
    fingerprint = signing.KeyVerifier(key).identity.id.removeprefix("sha256:")
    return EVIDENCE / "keys" / f"{name}-{fingerprint[:12]}.pub.pem"


def unpack_device(results: Path, into: Path) -> Path:
    parts = sorted(results.glob("evidence.tar.gz.part-*"))
    if not parts:
        raise SystemExit(f"{results}: no evidence.tar.gz.part-* (device_gate.sh's output)")
    cat = subprocess.Popen(["cat", *map(str, parts)], stdout=subprocess.PIPE)
    subprocess.run(["tar", "xzf", "-", "-C", str(into)], stdin=cat.stdout, check=True)
    cat.wait()
    return into / "evidence"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--key", type=Path, required=True, help="public key PEM the bundles verify with")
    ap.add_argument("--key-name", default="device", help="name in the key's file name")
    ap.add_argument("--from-device", type=Path, help="device_gate.sh results directory")
    ap.add_argument("bundles", nargs="+", help="bundle dirs, or ROW/BUNDLE-ID with --from-device")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        base = unpack_device(args.from_device, Path(tmp)) if args.from_device else None
        verifier = signing.KeyVerifier(args.key)
        for ref in args.bundles:
            bundle = Bundle.open(base / ref if base else Path(ref))
            who = bundle.verify(verifier)  # VerificationError names the first problem
            dest = EVIDENCE / bundle.manifest.row.id / bundle.id
            if dest.exists():
                print(f"{dest.relative_to(ROOT)}: already checked in")
                continue
            size = tree_bytes(bundle.path)
            total = tree_bytes(EVIDENCE) if EVIDENCE.exists() else 0
            if total + size > BUDGET_BYTES:
                raise SystemExit(f"{bundle.id}: {size / 1e6:.1f} MB would bring docs/evidence to "
                                 f"{(total + size) / 1e6:.1f} MB (budget {BUDGET_BYTES / 1e6:.0f} MB)")
            shutil.copytree(bundle.path, dest)
            for p in [dest, *dest.rglob("*")]:  # writable in the checkout, like any file
                p.chmod(0o755 if p.is_dir() else 0o644)
            print(f"{dest.relative_to(ROOT)}: {len(bundle.manifest.files)} files, "
                  f"{size / 1e6:.2f} MB, signed by {who}")
        pem = key_file(args.key, args.key_name)
        pem.parent.mkdir(parents=True, exist_ok=True)
        if not pem.exists():
            shutil.copyfile(args.key, pem)
        print(f"key: {pem.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
