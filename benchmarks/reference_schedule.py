"""The release's decode executing path per step, computed without a GPU by running the
release's own schedule builder (cohere-ai/cohere-megakernel, `src/decode/schedule.py`)
inside rowgate's sandbox.

    PYTHONPATH=. python benchmarks/reference_schedule.py --subject SUBJECT --out OUT \
        [--batches 1 8] [--context N]

The release is untrusted code, so nothing of it runs in this process: this script writes
a small probe program (`PROBE` below) into a private scratch directory and runs it with
`rowgate.sandbox.run(..., confined=True)` (bubblewrap: the subject read-only, the scratch
the only writable directory, no network, an allowlisted environment, a wall-time limit).
The interpreter running this script must have torch (CPU) and triton, which the
release's modules import; the sandbox shows the step that interpreter's own prefix.

Inside, the probe puts SUBJECT/src on `sys.path`, takes the synthetic runner's defaults
from the release's own `runner._parse_args(["--mk", "--fast", "--batch-size", B])`
(num_sms, page_block, attention split policy, drains on/off, the fake prompt length),
the geometry from `prefill.torch_prefill.NmcConfig.release()` and the tiling from
`default_nmc_tiling_for_bs`, and builds on `torch.device("cpu")` what
`run_mk_decode_from_prefill` builds before its first step: the context-bucket registry
(`build_nmc_rr_decode_variant_registry`, whose one chunk per bucket comes from
`build_nmc_decode_schedule_chunks`), the variant step 0 selects (context = position +
1), the named dependency waves behind that chunk (`_build_nmc_decode_named_waves`) and,
with the attention drain on, step 0's full-attention work queue (`build_attn_drain_queue`).
It prints one JSON document: per batch the waves, the tasks per NmcOp kind (from the
chunk's instruction words), per-layer groups, tasks per SM, the barrier/counter arrays
(slot counts evaluated from `make_decode_state`'s own allocation expressions, which need
CUDA to run as a whole) and the wait/produce fields the instruction words carry.

`--context N` is the KV position before the decode step (the runner's
`--fake-prompt-len`; the release's default when omitted). The document, with the
subject's pinned commit and source digests, goes to OUT/reference-schedule.json; the
probe's stderr (the release's log lines) to OUT/reference-schedule.stderr.txt.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from rowgate import sandbox

PROBE_NAME = "reference_schedule_probe.py"
SOURCES = ("src/decode/schedule.py", "src/prefill/torch_prefill.py", "src/runner.py",
           "src/native.py", "src/kv/pool.py")
"""The subject's modules the probe imports (their digests go into the output)."""
WALL_S = 600.0

PROBE = r'''
"""Runs inside rowgate's sandbox: builds the release's decode schedule on the CPU and
prints one JSON document on stdout (everything else goes to stderr)."""
import ast
import contextlib
import inspect
import json
import logging
import platform
import statistics
import sys
from collections import Counter

LAYOUTS = {
    "QKV_PROJ": "qkv_field", "ATTN_DECODE": "attn_field", "ATTN_COMBINE": "combine_field",
    "ATTN_DRAIN": "attn_drain_field", "ROUTER_TOPK": "router_topk_field",
    "ROUTE_FINALIZE": "route_finalize_field", "MOE_GATHER": "moe_gather_field",
    "ADD_RMSNORM": "rmsnorm_field", "FFN_UPGATE_ACT": "gemm_field", "FFN_DOWN": "gemm_field",
    "O_PROJ": "gemm_field", "LM_HEAD": "gemm_field", "ROUTER_GEMM": "gemm_field",
}
"""Instruction-word layout class (schedule.py) each opcode's builder fills; the MoE
drains and MOE_COMBINE carry only opcode/layer(/row), so no barrier fields."""


def load(src):
    sys.path.insert(0, src)
    import decode.schedule as schedule
    import prefill.torch_prefill as torch_prefill
    import runner
    import torch
    return schedule, torch_prefill, runner, torch


def settings(schedule, runner, batch, context):
    argv = ["--mk", "--fast", "--batch-size", str(batch)]
    if context is not None:
        argv += ["--fake-prompt-len", str(context)]
    a = runner._parse_args(argv)
    return {
        "num_sms": int(a.num_sms), "page_block": int(a.page_block),
        "max_attn_splits": schedule.DEFAULT_MAX_ATTN_SPLITS if a.max_attn_splits is None
        else int(a.max_attn_splits),
        "min_attn_chunk": schedule.DEFAULT_MIN_ATTN_CHUNK if a.min_attn_chunk is None
        else int(a.min_attn_chunk),
        "attn_drain": bool(a.attn_drain), "attn_drain_sms": a.attn_drain_sms,
        "moe_drain_sms": a.moe_drain_sms, "rr_dependency_affinity": bool(a.rr_dependency_affinity),
        "ablation": bool(a.ablation), "moe_combine_atomic_tma": bool(a.moe_combine_atomic_tma),
        "kv_position": int(a.fake_prompt_len[0]), "decode_steps": max(0, int(a.max_new_tokens) - 1),
    }


def common(s):
    keys = ("page_block", "max_attn_splits", "min_attn_chunk", "attn_drain", "attn_drain_sms",
            "moe_drain_sms")
    return {k: s[k] for k in keys}


def registry(schedule, torch, cfg, tiling, s, batch):
    pos = s["kv_position"]
    return schedule.build_nmc_rr_decode_variant_registry(
        cfg=cfg, batch=batch, num_sms=s["num_sms"], device=torch.device("cpu"), tiling=tiling,
        num_layers=int(cfg.num_hidden_layers), launch_mode="all", min_context_len=pos + 1,
        max_context_len=pos + max(1, s["decode_steps"]),
        rr_dependency_affinity=s["rr_dependency_affinity"], ablation=s["ablation"], **common(s))


def named_waves(schedule, cfg, tiling, s, batch, bucket):
    waves, _ = schedule._build_nmc_decode_named_waves(
        cfg=cfg, batch=batch, num_sms=s["num_sms"], tiling=tiling, attn_seq_len=bucket,
        include_lm_head=True, **common(s))
    return waves


def chunk_rows(chunk):
    buf, counts = chunk.inst_buf.tolist(), chunk.inst_counts.tolist()
    return [buf[sm][:n] for sm, n in enumerate(counts)]


def same_as_chunk(schedule, torch, waves, chunk, s):
    if s["rr_dependency_affinity"]:
        return None  # affinity placement: only the per-kind counts are compared
    inst, cnt = schedule._round_robin_waves([w for _, _, w in waves], s["num_sms"],
                                            torch.device("cpu"), ablation=s["ablation"])
    return bool(torch.equal(inst, chunk.inst_buf) and torch.equal(cnt, chunk.inst_counts))


def field_stats(schedule, rows, names):
    out = {}
    for name in sorted({names[r[0]] for r in rows}):
        layout = getattr(schedule, LAYOUTS.get(name, ""), None)
        fields = {k: v for k, v in vars(layout).items()
                  if k.isupper() and ("WAIT" in k or "BAR" in k)} if layout else {}
        mine = [r for r in rows if names[r[0]] == name]
        out[name] = {k: stats(k, [r[i] for r in mine]) for k, i in sorted(fields.items())}
    return out


def stats(field, values):
    """Range and distinct values of one word; for a wait target also the instructions
    with a nonzero target and the targets' sum (0: no wait, or the dynamic sentinel)."""
    out = {"min": min(values), "max": max(values), "distinct": len(set(values))}
    if "TARGET" in field:
        out.update(nonzero=sum(1 for v in values if v), sum=sum(values))
    return out


def layer_groups(waves, names, cfg):
    order, kinds = {}, {}
    for label, layer, wave in waves:
        order.setdefault(layer, []).append([label.split(".", 1)[-1], len(wave)])
        kinds.setdefault(layer, Counter()).update(names[r[0]] for r in wave)
    groups = {}
    for layer in order:
        attn = cfg.layer_types[layer] if layer >= 0 else "-"
        ffn = "-" if layer < 0 else ("moe" if layer >= cfg.first_k_dense_replace else "dense")
        key = json.dumps([attn, ffn, order[layer], sorted(kinds[layer].items())])
        groups.setdefault(key, {"layers": [], "attention": attn, "ffn": ffn,
                                "waves": order[layer], "tasks": sum(kinds[layer].values()),
                                "tasks_by_kind": dict(sorted(kinds[layer].items()))})
        groups[key]["layers"].append(layer)
    return list(groups.values())


def barrier_slots(schedule, cfg, tiling, batch):
    """make_decode_state's `bar_*` sizes, evaluated from its own expressions (the
    function allocates CUDA tensors, so it cannot run here)."""
    tree = ast.parse(inspect.getsource(schedule.make_decode_state))
    env = {"cfg": cfg, "tiling": tiling, "batch": batch, "layers": int(cfg.num_hidden_layers)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and any(
                getattr(t, "id", None) == "moe_row_blocks" for t in node.targets):
            env["moe_row_blocks"] = evaluate(schedule, node.value, env)
    for node in ast.walk(tree):
        if isinstance(node, ast.Dict) and node.keys and all(
                isinstance(k, ast.Constant) and str(k.value).startswith("bar_") for k in node.keys):
            return {k.value: evaluate(schedule, v, env) for k, v in zip(node.keys, node.values)}, env
    return None, env


def evaluate(schedule, node, env):
    return int(eval(compile(ast.Expression(node), "make_decode_state", "eval"),
                    dict(vars(schedule)), dict(env)))


def barriers(schedule, cfg, tiling, batch):
    slots, env = barrier_slots(schedule, cfg, tiling, batch)
    reset = list(schedule._RESET_NAMES)
    return {"names": [n for n in schedule._LAUNCH_DESC_TENSOR_FIELDS if n.startswith("bar_")],
            "slots": slots, "slots_total": sum(slots.values()) if slots else None,
            "moe_row_blocks_per_layer": env.get("moe_row_blocks"),
            "zeroed_per_step": reset,
            "barriers_zeroed_per_step": [n for n in reset if n.startswith("bar_")]}


def drain_queue(schedule, cfg, tiling, s, batch):
    if not s["attn_drain"]:
        return None
    q = schedule.build_attn_drain_queue(
        cfg=cfg, batch=batch, num_sms=s["num_sms"], tiling=tiling, page_block=s["page_block"],
        max_attn_splits=s["max_attn_splits"], min_attn_chunk=s["min_attn_chunk"],
        cache_seqlens=[s["kv_position"]] * batch, oversub_k=1)
    full = sum(1 for t in cfg.layer_types if t == "full_attention")
    return {"cache_seqlens": [s["kv_position"]] * batch, "queue_len": q["queue_len"],
            "per_row_splits": q["per_row_splits"], "full_attention_layers": full,
            "attn_decode_tasks_per_step": q["queue_len"] * full}


def per_sm(chunk, rows):
    counts = [len(r) for r in rows]
    return {"num_sms": len(counts), "sms_with_tasks": sum(1 for c in counts if c),
            "max_inst_rows": int(chunk.inst_buf.shape[1]),
            "inst_buf_shape": list(chunk.inst_buf.shape), "min": min(counts),
            "mean": statistics.fmean(counts), "max": max(counts)}


def one_batch(mods, cfg, batch, context):
    schedule, _, runner, torch = mods
    s = settings(schedule, runner, batch, context)
    tiling = schedule.default_nmc_tiling_for_bs(
        batch=batch, moe_combine_atomic_tma=s["moe_combine_atomic_tma"])
    reg = registry(schedule, torch, cfg, tiling, s, batch)
    variant = reg.select(s["kv_position"] + 1)
    chunk = variant.schedule_chunks[0]
    waves = named_waves(schedule, cfg, tiling, s, batch, variant.bucket_upper)
    names = {v: k for k, v in vars(schedule.NmcOp).items() if k.isupper()}
    rows = [r for sm in chunk_rows(chunk) for r in sm]
    kinds = Counter(names[r[0]] for r in rows)
    wave_kinds = Counter(names[r[0]] for _, _, w in waves for r in w)
    return {
        "batch": batch, "settings": s, "tiling": json.loads(tiling.as_json()),
        "registry": {"buckets": [v.bucket_upper for v in reg.variants],
                     "unique_schedules": len(reg.unique_schedule_variants()),
                     "step0_context_len": s["kv_position"] + 1,
                     "step0_bucket_upper": variant.bucket_upper,
                     "step0_split_signature": list(variant.split_signature)},
        "chunks": [c.label for c in variant.schedule_chunks],
        "waves": len(waves), "tasks": len(rows), "tasks_by_kind": dict(sorted(kinds.items())),
        "named_waves_tasks_by_kind_match": wave_kinds == kinds,
        "named_waves_serialize_to_chunk": same_as_chunk(schedule, torch, waves, chunk, s),
        "per_sm": per_sm(chunk, chunk_rows(chunk)),
        "layer_groups": layer_groups(waves, names, cfg),
        "wave_labels": [[label, len(w)] for label, _, w in waves],
        "barriers": barriers(schedule, cfg, tiling, batch),
        "instruction_wait_produce_fields": field_stats(schedule, rows, names),
        "attn_drain_queue_step0": drain_queue(schedule, cfg, tiling, s, batch),
    }


def main():
    request = json.loads(sys.argv[1])
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    with contextlib.redirect_stdout(sys.stderr):
        mods = load(request["src"])
        cfg = mods[1].NmcConfig.release()
        doc = {"python": platform.python_version(), "torch": mods[3].__version__,
               "triton": getattr(sys.modules.get("triton"), "__version__", None),
               "config": {k: (list(v) if isinstance(v, tuple) else v)
                          for k, v in vars(cfg).items()},
               "batches": [one_batch(mods, cfg, b, request["context"])
                           for b in request["batches"]]}
    json.dump(doc, sys.stdout)


main()
'''


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--subject", type=Path, required=True, help="the release's checkout")
    p.add_argument("--out", type=Path, required=True, help="where the JSON goes")
    p.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    p.add_argument("--context", type=int, default=None,
                   help="KV position before the step (default: the release runner's)")
    return p.parse_args(argv)


def provenance(subject: Path) -> dict[str, Any]:
    """The reconstruction's record next to the subject: path, pinned commit, and each
    imported source's sha256 against the one recorded there."""
    path = subject.with_name(f"{subject.name}.PROVENANCE.json")
    record = json.loads(path.read_text()) if path.is_file() else {}
    recorded = {f["path"]: f.get("sha256") for f in record.get("files", [])}
    sources = {}
    for rel in SOURCES:
        digest = hashlib.sha256((subject / rel).read_bytes()).hexdigest()
        sources[rel] = {"sha256": digest, "matches_provenance": recorded.get(rel) == digest}
    return {"subject": str(subject), "provenance_file": str(path) if record else None,
            "repository": record.get("subject"), "pinned_commit": record.get("target_commit"),
            "sources": sources}


def run_probe(subject: Path, scratch: Path, batches: list[int],
              context: int | None) -> sandbox.Result:
    probe = scratch / PROBE_NAME
    probe.write_text(PROBE)
    request = json.dumps({"src": str(subject / "src"), "batches": batches, "context": context})
    step = sandbox.Step([sys.executable, str(probe), request], cwd=scratch,
                        read_only=[subject], writable=[scratch],
                        limits=sandbox.Limits(wall_s=WALL_S))
    return sandbox.run(step, confined=True)


def problems(doc: dict[str, Any], batches: list[int]) -> list[str]:
    """What makes the probe's document unusable (empty when it is sound)."""
    found = [b.get("batch") for b in doc.get("batches", [])]
    if found != batches:
        return [f"batches {found}, asked for {batches}"]
    bad = []
    for b in doc["batches"]:
        per_sm = b["per_sm"]
        if sum(b["tasks_by_kind"].values()) != b["tasks"]:
            bad.append(f"batch {b['batch']}: kind counts do not sum to the task count")
        if per_sm["sms_with_tasks"] > per_sm["num_sms"] or per_sm["max"] > per_sm["max_inst_rows"]:
            bad.append(f"batch {b['batch']}: per-SM counts exceed the instruction buffer")
        if not b["named_waves_tasks_by_kind_match"] or b["named_waves_serialize_to_chunk"] is False:
            bad.append(f"batch {b['batch']}: the named waves disagree with the built chunk")
        if b["barriers"]["slots"] is None:
            bad.append(f"batch {b['batch']}: barrier sizes not found in make_decode_state")
    return bad


def main(argv: list[str] | None = None) -> int:
    ns = parse_args(argv)
    subject = ns.subject.resolve()
    sandbox.check_available()
    scratch = Path(tempfile.mkdtemp(prefix="refsched-"))
    try:
        done = run_probe(subject, scratch, ns.batches, ns.context)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    ns.out.mkdir(parents=True, exist_ok=True)
    (ns.out / "reference-schedule.stderr.txt").write_bytes(done.stderr)
    if done.returncode != 0:
        tail = done.stderr.decode(errors="replace")[-2000:]
        raise SystemExit(f"probe exited {done.returncode} {done.limit}\n{tail}")
    doc = json.loads(done.stdout)
    bad = problems(doc, ns.batches)
    if bad:
        raise SystemExit("probe output rejected: " + "; ".join(bad))
    doc = {"release": provenance(subject), "sandbox": sandbox.describe(),
           "probe_seconds": round(done.duration_s, 3), **doc}
    (ns.out / "reference-schedule.json").write_text(json.dumps(doc, indent=1) + "\n")
    for b in doc["batches"]:
        print(f"batch {b['batch']}: waves={b['waves']} tasks={b['tasks']} "
              f"per_sm={b['per_sm']['min']}..{b['per_sm']['max']} kinds={b['tasks_by_kind']}")
    print(f"wrote {ns.out / 'reference-schedule.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
