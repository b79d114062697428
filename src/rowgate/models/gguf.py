"""A GGUF file of a Qwen3-architecture model directory, for llama.cpp arms.

llama.cpp reads GGUF, not safetensors. The file is written here, locally, with
the `gguf` package (llama.cpp's own writer library): its tensor-name map for
the `qwen3` architecture, the hyper-parameters llama.cpp's loader reads, and the
model's vocabulary. Nothing is converted by llama.cpp's scripts and nothing is
downloaded.

Conventions llama.cpp's loader expects for `qwen3` (checked against llama.cpp's
converter and loader, not copied from them):

* tensors keep the Hugging Face layout: Qwen rotates query/key halves (NeoX
  rope), so unlike Llama no q/k permutation is applied;
* weights stay at the checkpoint's precision (float32 or float16), so a float32
  row compares a float32 llama.cpp forward;
* the vocabulary is written as a SentencePiece-style ("llama") token list with
  zero scores: rowgate's prompts are token ids, never text, and a WordLevel
  vocabulary has no BPE merges (GGUF cannot hold an empty merge list, and
  llama.cpp's BPE loader requires one). Special tokens are CONTROL tokens.

A file is cached per model digest under `build/models/gguf/` with its sha256,
which the arm records.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rowgate import dirs
from rowgate.models.tiny import ModelError, model_info

GGUF_ROOT = dirs.cache("models", "gguf")
WRITER_VERSION = 1
"""Bumped whenever the bytes written for a model change."""
ARCHITECTURES = ("Qwen3ForCausalLM",)


@dataclass(frozen=True)
class GgufFile:
    path: Path
    sha256: str
    model_digest: str


def _config(model_dir: Path) -> dict[str, Any]:
    try:
        config: dict[str, Any] = json.loads((model_dir / "config.json").read_text())
    except (OSError, ValueError) as exc:
        raise ModelError(f"{model_dir}: cannot read config.json for the GGUF file") from exc
    arch = (config.get("architectures") or ["?"])[0]
    if arch not in ARCHITECTURES:
        raise ModelError(f"{model_dir}: architecture {arch!r} has no GGUF writer here "
                         f"(supported: {', '.join(ARCHITECTURES)})")
    return config


def _vocabulary(model_dir: Path, vocab_size: int) -> tuple[list[str], list[int]]:
    """Token strings by id and their llama.cpp token types, from tokenizer.json."""
    import gguf

    try:
        doc = json.loads((model_dir / "tokenizer.json").read_text())
    except (OSError, ValueError) as exc:
        raise ModelError(f"{model_dir}: cannot read tokenizer.json for the GGUF file") from exc
    tokens: list[str | None] = [None] * vocab_size
    for text, i in doc.get("model", {}).get("vocab", {}).items():
        if 0 <= i < vocab_size:
            tokens[i] = text
    special = set()
    for added in doc.get("added_tokens", []):
        if 0 <= added["id"] < vocab_size:
            tokens[added["id"]] = added["content"]
            if added.get("special"):
                special.add(added["id"])
    # Ids the tokenizer never names still need an entry: llama.cpp sizes its output by them.
    names = [t if t is not None else f"<unused{i}>" for i, t in enumerate(tokens)]
    types = [int(gguf.TokenType.CONTROL if i in special else gguf.TokenType.UNUSED
                 if tokens[i] is None else gguf.TokenType.NORMAL) for i in range(vocab_size)]
    return names, types


def _hyper_parameters(writer: Any, c: dict[str, Any]) -> None:
    writer.add_context_length(c["max_position_embeddings"])
    writer.add_embedding_length(c["hidden_size"])
    writer.add_block_count(c["num_hidden_layers"])
    writer.add_feed_forward_length(c["intermediate_size"])
    writer.add_head_count(c["num_attention_heads"])
    writer.add_head_count_kv(c["num_key_value_heads"])
    head_dim = c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    rope = c.get("rope_parameters") or {}
    writer.add_rope_freq_base(float(rope.get("rope_theta", c.get("rope_theta", 10000.0))))
    writer.add_layer_norm_rms_eps(c["rms_norm_eps"])


def _tensors(writer: Any, model_dir: Path, layers: int) -> None:
    import gguf
    import numpy as np
    from safetensors.numpy import load_file

    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.QWEN3, layers)
    shards = sorted(model_dir.glob("*.safetensors"))
    if not shards:
        raise ModelError(f"{model_dir}: no *.safetensors weights for the GGUF file")
    weights: dict[str, Any] = {}
    for shard in shards:
        try:
            weights.update(load_file(str(shard)))
        except (OSError, ValueError, TypeError) as exc:  # bf16 has no numpy dtype
            raise ModelError(f"{shard}: cannot be read for the GGUF file (float32 or "
                             f"float16 weights only)") from exc
    weights.setdefault("lm_head.weight", weights["model.embed_tokens.weight"])  # tied
    half = any(a.dtype == np.float16 for a in weights.values())
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16 if half else gguf.LlamaFileType.ALL_F32)
    for name in sorted(weights):
        base, _, suffix = name.rpartition(".")
        mapped = names.get_name(base)
        if mapped is None:
            raise ModelError(f"{model_dir}: tensor {name!r} has no qwen3 GGUF name")
        array = weights[name]
        if array.dtype not in (np.float32, np.float16):
            raise ModelError(f"{model_dir}: tensor {name!r} is {array.dtype}; the GGUF "
                             f"writer keeps float32 or float16 only")
        writer.add_tensor(f"{mapped}.{suffix}", np.ascontiguousarray(array))


def write_gguf(model_dir: Path, dest: Path) -> None:
    """Write `model_dir` (a Qwen3 Hugging Face directory) as a GGUF file at `dest`."""
    import gguf

    c = _config(model_dir)
    writer = gguf.GGUFWriter(str(dest), gguf.MODEL_ARCH_NAMES[gguf.MODEL_ARCH.QWEN3])
    writer.add_name(model_dir.name)
    _hyper_parameters(writer, c)
    tokens, types = _vocabulary(model_dir, int(c["vocab_size"]))
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores([0.0] * len(tokens))
    writer.add_token_types(types)
    eos = c.get("eos_token_id", 0)
    writer.add_eos_token_id(eos[0] if isinstance(eos, list) else eos)
    writer.add_bos_token_id(c.get("bos_token_id") or 0)
    writer.add_add_bos_token(False)  # prompts are the row's token ids, nothing prepended
    _tensors(writer, model_dir, int(c["num_hidden_layers"]))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return "sha256:" + h.hexdigest()


def gguf_for(model_dir: Path, root: Path | None = None) -> GgufFile:
    """The GGUF file of a model directory: reused when its record still matches, else
    written (atomically: an interrupted write never leaves a file an engine loads)."""
    digest = model_info(model_dir).digest
    key = hashlib.sha256(f"{WRITER_VERSION}/{digest}".encode()).hexdigest()[:16]
    out = (root or GGUF_ROOT) / key
    path, record = out / "model.gguf", out / "record.json"
    try:
        doc = json.loads(record.read_text())
        if doc["model_digest"] == digest and _sha256(path) == doc["sha256"]:
            return GgufFile(path, doc["sha256"], digest)
    except (OSError, ValueError, KeyError):
        pass
    out.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".model-", suffix=".gguf", dir=out)
    os.close(fd)
    try:
        write_gguf(model_dir, Path(tmp))
        sha = _sha256(Path(tmp))
        os.replace(tmp, path)
    finally:
        Path(tmp).unlink(missing_ok=True)
    record.write_text(json.dumps({"writer": WRITER_VERSION, "model_digest": digest,
                                  "sha256": sha}, indent=2) + "\n")
    return GgufFile(path, sha, digest)
