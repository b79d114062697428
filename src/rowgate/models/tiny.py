"""The tiny model: a Qwen3-architecture checkpoint built locally and deterministically.

Nothing is downloaded. The weights come from a fixed seed, the tokenizer is a
WordLevel vocabulary built with `tokenizers`, and the directory holds exactly
what vLLM and transformers load offline: config.json, model.safetensors,
tokenizer.json, tokenizer_config.json, generation_config.json.

The lm_head is scaled up so greedy decoding has margins between the top two
logits far above float32 noise: two correct float32 engines then agree token for
token, and a disagreement means a real difference, not rounding.

A build is cached by its spec under `build/models/tiny-qwen3/<spec-key>/`; its
content digest (sha256 over the model files) is recorded beside it and
checked on every reuse.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rowgate import dirs, storage
from rowgate.errors import UsageError

if TYPE_CHECKING:
    from rowgate.rows.spec import ModelRef

BUILDER_VERSION = 1
"""Bumped whenever the bytes a spec builds into change."""

DEFAULT_ROOT = dirs.cache("models", "tiny-qwen3")
MODEL_FILES = ("config.json", "generation_config.json", "model.safetensors",
               "tokenizer.json", "tokenizer_config.json")
RECORD_FILE = "rowgate-model.json"
"""Spec and digest of a build; not part of the digest itself."""

EOS_TOKEN = "<|endoftext|>"
UNK_TOKEN = "<unk>"


class ModelError(UsageError):
    """A model directory is missing, incomplete or not what its record says."""


@dataclass(frozen=True)
class TinyModelSpec:
    """Everything a tiny model's bytes depend on."""

    vocab_size: int = 1024
    hidden_size: int = 128
    intermediate_size: int = 256
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 64
    max_position: int = 2048
    rope_theta: float = 1_000_000.0
    rms_norm_eps: float = 1e-6
    seed: int = 0
    lm_head_scale: float = 8.0
    """Std of the logits: top-1/top-2 gaps are then O(1), float32 noise O(1e-5)."""

    def key(self) -> str:
        doc = json.dumps({"builder": BUILDER_VERSION, **asdict(self)}, sort_keys=True)
        return hashlib.sha256(doc.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class ModelInfo:
    """What engines and workloads need to know about a model directory."""

    path: Path
    digest: str
    vocab_size: int
    eos_token_id: int
    special_ids: tuple[int, ...]
    """Ids a prompt must not contain (EOS, UNK, any added special token)."""

    def describe(self) -> dict[str, str]:
        return {"model_path": str(self.path), "model_digest": self.digest}


# ------------------------------------------------------------------- digest


def _model_files(path: Path) -> list[Path]:
    """Every regular file of a model directory but rowgate's record and hidden caches."""
    return sorted(p for p in path.rglob("*") if p.is_file() and p.name != RECORD_FILE
                  and not any(part.startswith(".") for part in p.relative_to(path).parts))


def _file_sha256(file: Path) -> bytes:
    h = hashlib.sha256()
    with file.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.digest()


def model_digest(path: Path) -> str:
    """`sha256:<hex>` over the model files' relative names and contents, in name order."""
    if not (path / "config.json").is_file():
        raise ModelError(f"{path}: not a model directory (no config.json)")
    h = hashlib.sha256()
    for file in _model_files(path):
        h.update(file.relative_to(path).as_posix().encode() + b"\0")
        h.update(_file_sha256(file))
    return "sha256:" + h.hexdigest()


def model_info(path: Path) -> ModelInfo:
    """Read vocab size and special ids of a Qwen3-style model directory."""
    try:
        config = json.loads((path / "config.json").read_text())
        tokenizer = json.loads((path / "tokenizer.json").read_text())
    except (OSError, ValueError) as exc:
        raise ModelError(f"{path}: cannot read config.json / tokenizer.json") from exc
    eos = config.get("eos_token_id")
    eos_ids = eos if isinstance(eos, list) else [eos]
    special = {t["id"] for t in tokenizer.get("added_tokens", []) if t.get("special")}
    special.update(i for i in eos_ids if isinstance(i, int))
    return ModelInfo(path=path, digest=model_digest(path), vocab_size=int(config["vocab_size"]),
                     eos_token_id=int(eos_ids[0]), special_ids=tuple(sorted(special)))


# -------------------------------------------------------------------- build


def _config(spec: TinyModelSpec) -> dict[str, Any]:
    # Written by hand (not Qwen3Config.to_json) so the bytes do not depend on
    # the installed transformers version.
    return {
        "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3",
        "vocab_size": spec.vocab_size, "hidden_size": spec.hidden_size,
        "intermediate_size": spec.intermediate_size,
        "num_hidden_layers": spec.num_layers, "num_attention_heads": spec.num_heads,
        "num_key_value_heads": spec.num_kv_heads, "head_dim": spec.head_dim,
        "hidden_act": "silu", "max_position_embeddings": spec.max_position,
        "rms_norm_eps": spec.rms_norm_eps,
        "rope_theta": spec.rope_theta,
        "rope_parameters": {"rope_type": "default", "rope_theta": spec.rope_theta},
        "attention_bias": False, "attention_dropout": 0.0,
        "tie_word_embeddings": False, "use_sliding_window": False, "sliding_window": None,
        "max_window_layers": spec.num_layers, "initializer_range": 0.02,
        "bos_token_id": 0, "eos_token_id": 0, "pad_token_id": 0,
        "dtype": "float32", "torch_dtype": "float32", "use_cache": True,
    }


def seeded_weights(spec: TinyModelSpec) -> dict[str, Any]:
    """The random tiny model's float32 weights, from the spec's seed."""
    import torch

    gen = torch.Generator().manual_seed(spec.seed)

    def normal(*shape: int, std: float, mean: float = 0.0) -> Any:
        return (torch.randn(*shape, generator=gen, dtype=torch.float32) * std + mean).contiguous()

    def linear(out_f: int, in_f: int) -> Any:
        return normal(out_f, in_f, std=in_f ** -0.5)

    h, d = spec.hidden_size, spec.head_dim
    w = {"model.embed_tokens.weight": normal(spec.vocab_size, h, std=1.0)}
    for i in range(spec.num_layers):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"] = normal(h, std=0.1, mean=1.0)
        w[p + "self_attn.q_proj.weight"] = linear(spec.num_heads * d, h)
        w[p + "self_attn.k_proj.weight"] = linear(spec.num_kv_heads * d, h)
        w[p + "self_attn.v_proj.weight"] = linear(spec.num_kv_heads * d, h)
        w[p + "self_attn.o_proj.weight"] = linear(h, spec.num_heads * d)
        w[p + "self_attn.q_norm.weight"] = normal(d, std=0.1, mean=1.0)
        w[p + "self_attn.k_norm.weight"] = normal(d, std=0.1, mean=1.0)
        w[p + "post_attention_layernorm.weight"] = normal(h, std=0.1, mean=1.0)
        w[p + "mlp.gate_proj.weight"] = linear(spec.intermediate_size, h)
        w[p + "mlp.up_proj.weight"] = linear(spec.intermediate_size, h)
        w[p + "mlp.down_proj.weight"] = linear(h, spec.intermediate_size)
    w["model.norm.weight"] = normal(h, std=0.1, mean=1.0)
    w["lm_head.weight"] = normal(spec.vocab_size, h, std=spec.lm_head_scale * h ** -0.5)
    return w


def filler_vocabulary(size: int) -> dict[str, int]:
    """The random tiny model's words: EOS, UNK, then `t2` … `t<size-1>`."""
    vocab = {EOS_TOKEN: 0, UNK_TOKEN: 1}
    vocab.update({f"t{i}": i for i in range(2, size)})
    return vocab


def _write_tokenizer(spec: TinyModelSpec, out: Path, vocab: dict[str, int]) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK_TOKEN))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens([EOS_TOKEN, UNK_TOKEN])
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "eos_token": EOS_TOKEN,
        "pad_token": EOS_TOKEN, "unk_token": UNK_TOKEN, "model_max_length": spec.max_position,
        "clean_up_tokenization_spaces": False}, indent=2, sort_keys=True) + "\n")


def write_files(spec: TinyModelSpec, out: Path, weights: dict[str, Any],
                vocab: dict[str, int] | None = None) -> None:
    """config, generation config, weights and a WordLevel tokenizer of `vocab`
    (default: the filler vocabulary) into `out`."""
    from safetensors.torch import save_file

    (out / "config.json").write_text(json.dumps(_config(spec), indent=2, sort_keys=True) + "\n")
    (out / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": 0, "eos_token_id": 0, "pad_token_id": 0}, indent=2) + "\n")
    save_file(weights, str(out / "model.safetensors"), metadata={"format": "pt"})
    _write_tokenizer(spec, out, vocab or filler_vocabulary(spec.vocab_size))


def _publish(tmp: Path, dest: Path, record: dict[str, Any]) -> None:
    (tmp / RECORD_FILE).write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
    if dest.exists():
        shutil.rmtree(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    # A rename is atomic: a concurrent or interrupted build never leaves a
    # half-written model where an engine would load it.
    os.replace(tmp, dest)


def _cached(dest: Path) -> ModelInfo | None:
    try:
        record = json.loads((dest / RECORD_FILE).read_text())
        info = model_info(dest)
    except (OSError, ValueError, ModelError):
        return None
    return info if record.get("digest") == info.digest else None


def build_tiny_model(spec: TinyModelSpec = TinyModelSpec(), root: Path | None = None) -> ModelInfo:
    """Build (or reuse the cached build of) the tiny model for `spec`."""
    dest = (root or DEFAULT_ROOT) / spec.key()
    cached = _cached(dest)
    if cached is not None:
        return cached
    with storage.one_builder(dest):
        return _cached(dest) or _build_tiny(spec, dest)


def _build_tiny(spec: TinyModelSpec, dest: Path) -> ModelInfo:
    tmp = Path(tempfile.mkdtemp(prefix=".build-", dir=dest.parent))
    try:
        write_files(spec, tmp, seeded_weights(spec))
        digest = model_digest(tmp)
        _publish(tmp, dest, {"builder": BUILDER_VERSION, "spec": asdict(spec), "digest": digest})
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return model_info(dest)


# ------------------------------------------------------------ trained models


TRAINER_VERSION = 1
"""Bumped whenever the bytes a training spec produces change (src/rowgate/models/train.py)."""
TRAINED_ROOT = dirs.cache("models")
DETERMINISTIC_ENV = {"ATEN_CPU_CAPABILITY": "default", "MKL_CBWR": "COMPATIBLE",
                     "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONHASHSEED": "0"}
"""The training interpreter's environment: what could change a sum, pinned before torch
loads (src/rowgate/models/train.py says why each)."""


@dataclass(frozen=True)
class TrainSpec:
    """A tiny model trained on a GSM8K-format file; everything its bytes depend on
    besides the file's own bytes."""

    dataset: str = "data/gsm8k-tiny.jsonl"
    """Relative to rowgate's demos (package data)."""
    steps: int = 40
    lr: float = 1e-2
    init: TinyModelSpec = TinyModelSpec(lm_head_scale=1.0)
    """Architecture and seeded starting weights (the random tiny model's builder)."""

    def dataset_path(self) -> Path:
        path = Path(self.dataset)
        return path if path.is_absolute() else dirs.demos_dir() / path

    def key(self, dataset_sha256: str) -> str:
        doc = json.dumps({"trainer": TRAINER_VERSION, "dataset_sha256": dataset_sha256,
                          **asdict(self)}, sort_keys=True)
        return hashlib.sha256(doc.encode()).hexdigest()[:16]

    @classmethod
    def from_json(cls, text: str) -> "TrainSpec":
        raw = json.loads(text)
        return cls(**{**raw, "init": TinyModelSpec(**raw["init"])})


TRAINED_MODELS = {"tiny-qwen3-gsm8k": TrainSpec()}
"""Model names a row may use for a model rowgate trains itself (the demo row's)."""


def _train(spec: TrainSpec, out: Path) -> dict[str, float]:
    """Run src/rowgate/models/train.py in a fresh interpreter with the deterministic environment."""
    env = {**os.environ, **DETERMINISTIC_ENV}
    proc = subprocess.run([sys.executable, "-m", "rowgate.models.train", str(out),
                           json.dumps(asdict(spec))], capture_output=True, text=True, env=env,
                          cwd=out)
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise ModelError(f"training the tiny model on {spec.dataset} failed: {tail}")
    report: dict[str, float] = json.loads(proc.stdout.strip().splitlines()[-1])
    return report


def build_trained_model(name: str, root: Path | None = None) -> ModelInfo:
    """Train (or reuse the cached training of) the model `name` of TRAINED_MODELS."""
    spec = TRAINED_MODELS[name]
    try:
        data = spec.dataset_path().read_bytes()
    except OSError as exc:
        raise ModelError(f"model {name}: training data {spec.dataset} is not here") from exc
    dest = (root or TRAINED_ROOT) / name / spec.key(hashlib.sha256(data).hexdigest())
    cached = _cached(dest)
    if cached is not None:
        return cached
    with storage.one_builder(dest):
        return _cached(dest) or _build_trained(spec, data, dest)


def _build_trained(spec: TrainSpec, data: bytes, dest: Path) -> ModelInfo:
    tmp = Path(tempfile.mkdtemp(prefix=".train-", dir=dest.parent))
    try:
        report = _train(spec, tmp)
        _publish(tmp, dest, {"trainer": TRAINER_VERSION, "spec": asdict(spec),
                             "dataset_sha256": hashlib.sha256(data).hexdigest(),
                             "digest": model_digest(tmp), **report})
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return model_info(dest)


def perturbed_copy(src: Path, dest: Path, tensor: str, index: tuple[int, ...],
                   delta: float) -> ModelInfo:
    """A copy of `src` with one weight changed by `delta` (a deliberately wrong candidate)."""
    import torch
    from safetensors.torch import load_file, save_file

    weights = load_file(str(src / "model.safetensors"))
    if tensor not in weights:
        raise ModelError(f"{src}: no tensor {tensor!r} to perturb")
    weights[tensor] = weights[tensor].clone()
    weights[tensor][index] += torch.tensor(delta, dtype=weights[tensor].dtype)
    dest.mkdir(parents=True, exist_ok=True)
    for name in MODEL_FILES:
        if name != "model.safetensors":
            shutil.copyfile(src / name, dest / name)
    save_file(weights, str(dest / "model.safetensors"), metadata={"format": "pt"})
    return model_info(dest)


TINY_MODEL = "tiny-qwen3"
"""The model name a row uses for the model rowgate builds itself."""


def why_unavailable(ref: ModelRef) -> str | None:
    """Why a row's `ModelRef` cannot be had here (-> PENDING), or None: the tiny
    model, the trained tiny models and `synthetic` shapes are built; other weights
    must be local."""
    buildable = ref.name == TINY_MODEL or ref.name in TRAINED_MODELS or ref.synthetic is not None
    if buildable and not ref.weights:
        return None
    if not ref.weights:
        return f"model {ref.id} ({ref.name}): the row names no local weights path"
    path = Path(ref.weights).expanduser()
    if not (path / "config.json").is_file():
        return f"model {ref.id} ({ref.name}): weights not on this machine ({path})"
    return None


def resolve_model(ref: ModelRef) -> ModelInfo:
    """A row's `ModelRef` as a model directory: built (cached) or read locally."""
    why = why_unavailable(ref)
    if why:
        raise ModelError(why)
    if ref.weights:
        return model_info(Path(ref.weights).expanduser())
    if ref.synthetic is not None:
        return build_tiny_model(TinyModelSpec(**ref.synthetic.model_dump()))
    if ref.name in TRAINED_MODELS:
        return build_trained_model(ref.name)
    return build_tiny_model()
