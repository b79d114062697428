"""What the step builder and the fused list share: the model's dimensions (read from a
checkpoint's config), a workspace region, and the emitter that numbers counters."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rowgate.errors import UsageError
from rowgate_lab.megakernel.abi import GRANULE, Operand, Task


class ModelConfigError(UsageError):
    """A model config the builder cannot read."""


@dataclass(frozen=True)
class ModelDims:
    vocab: int
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    rms_eps: float
    max_position: int

    @classmethod
    def from_config(cls, c: dict[str, Any], where: str = "config") -> "ModelDims":
        try:
            return cls(vocab=c["vocab_size"], hidden=c["hidden_size"],
                       intermediate=c["intermediate_size"], layers=c["num_hidden_layers"],
                       heads=c["num_attention_heads"], kv_heads=c["num_key_value_heads"],
                       head_dim=c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"],
                       rms_eps=float(c["rms_norm_eps"]),
                       max_position=c["max_position_embeddings"])
        except KeyError as exc:
            raise ModelConfigError(f"{where}: missing key {exc.args[0]!r}") from exc

    @classmethod
    def load(cls, model_dir: Path) -> "ModelDims":
        path = Path(model_dir) / "config.json"
        try:
            return cls.from_config(json.loads(path.read_text()), str(path))
        except (OSError, ValueError) as exc:
            raise ModelConfigError(f"{path}: not a readable model config") from exc

    def weight_shapes(self) -> dict[str, tuple[int, ...]]:
        """Every tensor the step reads, by the reference engine's names."""
        h, d, q, kv = self.hidden, self.head_dim, self.heads * self.head_dim, \
            self.kv_heads * self.head_dim
        out: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (self.vocab, h)}
        for i in range(self.layers):
            p = f"model.layers.{i}."
            out.update({p + "input_layernorm.weight": (h,),
                        p + "self_attn.q_proj.weight": (q, h),
                        p + "self_attn.k_proj.weight": (kv, h),
                        p + "self_attn.v_proj.weight": (kv, h),
                        p + "self_attn.q_norm.weight": (d,),
                        p + "self_attn.k_norm.weight": (d,),
                        p + "self_attn.o_proj.weight": (h, q),
                        p + "post_attention_layernorm.weight": (h,),
                        p + "mlp.gate_proj.weight": (self.intermediate, h),
                        p + "mlp.up_proj.weight": (self.intermediate, h),
                        p + "mlp.down_proj.weight": (h, self.intermediate)})
        out["model.norm.weight"] = (h,)
        out["lm_head.weight"] = (self.vocab, h)
        out["rope.cos_sin"] = (self.max_position, d)  # cos | sin halves, bf16, per position
        return out


@dataclass(frozen=True)
class Region:
    slot: int
    offset: int
    """Bytes from the buffer base (a multiple of 256)."""
    nbytes: int

    @property
    def operand(self) -> Operand:
        return Operand(self.slot, self.offset // GRANULE)


class Emitter:
    def __init__(self) -> None:
        self.tasks: list[Task] = []
        self.counters = 0

    def counter(self) -> int:
        self.counters += 1
        return self.counters - 1

    def stage(self, tasks: list[Task], waits: tuple[tuple[int, int], ...]) -> tuple[int, int]:
        """Append `tasks`, all waiting on `waits` and signalling one new counter."""
        c = self.counter()
        for t in tasks:
            self.tasks.append(Task(t.opcode, t.tile, t.operands, waits, c, t.flags, t.label))
        return c, len(tasks)
