"""The AOT gate's derive: from `aot.json`, the unpacked images and `admission.json`
alone (pure; the review redoes it on the sealed bundle)."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import Any

from rowgate.gates.aot.spec import AotGate
from rowgate.gates.interface import Derived
from rowgate.records.status import Status

_IMAGE_ARCH = re.compile(r"\.(sm_\w+)\.cubin$")


def _first(text: str | None) -> str:
    lines = [ln.strip() for ln in (text or "").splitlines() if ln.strip()]
    fatal = [ln for ln in lines if "fatal" in ln.lower() or "error" in ln.lower()]
    return (fatal[-1] if fatal else lines[0] if lines else "unknown")[:200]


def verify_image(kdir: Path, answer: dict[str, Any]) -> str | None:
    """Why the packed fatbin is not exactly this cubin (for its arch) plus its PTX, or None."""
    embed = answer.get("embed") or {}
    if embed.get("error"):
        return f"packing failed: {_first(embed['error'])}"
    images = embed.get("images", [])
    if len(images) != 1:
        return f"{len(images)} embedded ELF image(s), expected exactly 1"
    m = _IMAGE_ARCH.search(images[0])
    target = answer.get("ptx_target") or ""
    if not m or m.group(1) != target:
        return f"embedded image is for {m.group(1) if m else 'an unknown arch'}, built {target}"
    digest = hashlib.sha256((kdir / "embedded" / images[0]).read_bytes()).hexdigest()
    built = hashlib.sha256((kdir / answer["cubin"]).read_bytes()).hexdigest()
    if digest != built or built != answer["cubin_sha256"]:
        return f"embedded image sha256 {digest[:16]} is not the compiled cubin's {built[:16]}"
    if not embed.get("ptx_listed"):
        return "no PTX beside the image: the portable fallback is missing"
    return None


def _verdict(admission: dict[str, Any], spec: AotGate) -> tuple[str, str]:
    """("material" | "not material" | "pending" | "none", why) of the admitting gate."""
    if not spec.admitted_by:
        return "none", "no admitting gate"
    if not admission.get("found"):
        return "pending", f"{spec.admitted_by} has no result before this gate"
    result = admission["result"]
    if result["status"] != Status.PASS.value:
        return "pending", f"{spec.admitted_by} is {result['status']} ({result['reason']})"
    verdict = result.get("metrics", {}).get("capacity_verdict")
    if verdict not in ("material", "not material"):
        return "pending", f"{spec.admitted_by} reports no capacity verdict"
    return verdict, f"{spec.admitted_by} verdict {verdict}"


def derive_aot(index: dict[str, Any], admission: dict[str, Any], spec: AotGate,
               artifact_dir: Path) -> Derived:
    metrics: dict[str, Any] = {"aot_kernels": len(index["kernels"]), "aot_image_mismatches": 0,
                     "aot_subject_failures": 0}
    cells: dict[str, dict[str, Any]] = {}
    problems: list[str] = []
    reach: dict[str, bool] = {}
    broken: set[str] = set()
    said = []
    for arch, per in index["arches"].items():
        probe = per["probe"]
        metrics["triton"] = probe.get("triton") or metrics.get("triton")
        reach[arch] = bool(probe.get("reachable")) and all(
            a.get("reachable") for a in per["kernels"].values())
        for name, answer in per["kernels"].items():
            cell = {"reachable": bool(answer.get("reachable")), "error": answer.get("error") or "",
                    "cubin_sha256": answer.get("cubin_sha256", ""), "embedded_verified": False}
            if answer.get("reachable"):
                bad = verify_image(artifact_dir / arch / name, answer)
                cell["embedded_verified"] = bad is None
                if bad:
                    metrics["aot_image_mismatches"] += 1
                    problems.append(f"{name} {arch}: {bad}")
                    broken.add(arch)
            elif probe.get("reachable"):  # Triton reaches the arch: the kernel itself failed
                metrics["aot_subject_failures"] += 1
                problems.append(f"{name} {arch}: {_first(answer.get('error'))}")
                broken.add(arch)
            cells[f"{name}@{arch}"] = cell
        metrics[f"aot_reachable_{arch}"] = int(reach[arch])
        said.append(f"{arch} {'yes' if reach[arch] else 'no: ' + _first(probe.get('error'))}")
    verdict, why = _verdict(admission, spec)
    refused, pending = [], []
    for arch in spec.enable:
        ok = reach.get(arch, False) and arch not in broken
        if verdict == "pending":  # undecided until the admitting gate runs, kernels or not
            pending.append(f"{arch}: {why}" + ("" if index["kernels"] else
                                               " (and the subject declares no Triton kernel)"))
        elif not index["kernels"]:
            refused.append(f"{arch}: the subject declares no Triton kernel")
        elif verdict == "not material" or not ok:
            refused.append(f"{arch}: {why if verdict == 'not material' else 'not reachable or not verified'}")
        metrics[f"aot_enabled_{arch}"] = int(ok and verdict in ("material", "none")
                                            and bool(index["kernels"]))
    metrics["aot_enable_refused"] = len(refused)
    summary = (f"{len(index['kernels'])} Triton kernel(s), Triton {metrics.get('triton')}: "
               + ", ".join(said) + "; portable PTX kept beside every image")
    if problems or refused:
        return Derived(Status.FAIL, "; ".join(problems + [f"enable refused: {r}" for r in refused])
                       + f" ({summary})", metrics, cells)
    if pending:  # a PENDING result carries no metrics: the facts are in the artifacts
        return Derived(Status.PENDING, f"enable undecided: {'; '.join(pending)} ({summary})")
    enabled = [a for a in spec.enable if metrics[f"aot_enabled_{a}"]]
    return Derived(Status.PASS, summary + (f"; enabled {', '.join(enabled)} ({why})"
                                           if enabled else ""), metrics, cells)
