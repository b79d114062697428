"""How fast does `rowgate verify` hash? Seals a generated bundle (default 1 GiB:
a few trace-sized files plus many small artifacts) and times verification.

    python benchmarks/verify_throughput.py [--gib 1.0] [--repeats 5]

Prints bytes, the median and spread of verify wall time, and GB/s (bytes covered by
the signature / median time). Page cache is warm after sealing: this measures hashing
and signature checking, not the disk.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from rowgate.rows import row as rows
from rowgate.run import provenance
from rowgate.seal import signing
from rowgate.seal.bundle import Bundle, Stage

ROW = '''id = "BENCH-VERIFY"
title = "verify benchmark"
kind = "demo"
[target]
arch = "cpu"
[arms.oracle]
engine = "vllm"
version = "0.32.0"
[arms.candidate]
engine = "reference"
[workload]
input_lens = [16]
concurrency = [1]
output_len = 4
[[gates]]
id = "host"
kind = "host"
'''


def _repo(tmp: Path) -> Path:
    repo = tmp / "subject"
    repo.mkdir()
    env = {**os.environ, "GIT_AUTHOR_NAME": "b", "GIT_AUTHOR_EMAIL": "b@example.com",
           "GIT_COMMITTER_NAME": "b", "GIT_COMMITTER_EMAIL": "b@example.com"}
    subprocess.run(["git", "init", "-q", "-b", "main"], cwd=repo, check=True)
    (repo / "f").write_text("x\n")
    subprocess.run(["git", "add", "f"], cwd=repo, check=True)
    subprocess.run(["git", "commit", "-qm", "x"], cwd=repo, check=True, env=env)
    return repo


def build(tmp: Path, gib: float) -> tuple[Path, signing.Signer]:
    row_path = tmp / "BENCH-VERIFY.toml"
    row_path.write_text(ROW)
    loaded = rows.load_row(row_path)
    stage = Stage(tmp / "evidence", loaded.row.id)
    d = stage.artifact_dir("host")
    d.mkdir(parents=True)
    total = int(gib * (1 << 30))
    big = total * 9 // 10 // 4
    for i in range(4):  # trace-sized files
        with open(d / f"trace-{i}.json.gz", "wb") as f:
            for _ in range(big // (16 << 20)):
                f.write(os.urandom(16 << 20))
    small = (total - 4 * big) // 400
    for i in range(400):  # per-repeat samples, logs
        (d / f"sample-{i:03d}.csv").write_bytes(os.urandom(small))
    signer = signing.default_signer(announce=lambda m: None)
    bundle = stage.seal(row=loaded, row_file=str(row_path), subject=provenance.subject(_repo(tmp)),
                        provenance=provenance.collect(), signer=signer, order=[])
    return bundle, signer


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--gib", type=float, default=1.0)
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args()
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_TMP")) as tmp:
        os.environ.setdefault("XDG_CONFIG_HOME", str(Path(tmp) / "config"))
        bundle, signer = build(Path(tmp), args.gib)
        size = sum(f.stat().st_size for f in bundle.rglob("*") if f.is_file())
        verifier = signer.verifier()
        times = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            Bundle.open(bundle).verify(verifier)
            times.append(time.perf_counter() - t0)
        med = statistics.median(times)
        print(f"bundle bytes      {size}")
        print(f"verify median s   {med:.3f}  (min {min(times):.3f}, max {max(times):.3f}, n={len(times)})")
        print(f"verify GB/s       {size / med / 1e9:.2f}")
        for dirpath, _, _ in os.walk(bundle):
            os.chmod(dirpath, 0o755)


if __name__ == "__main__":
    main()
