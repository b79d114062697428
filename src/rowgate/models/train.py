"""A tiny model that learned to answer and stop: the tiny Qwen3 trained on a GSM8K-format file.

A random-weight model never emits EOS, so a health gate on it can only FAIL.
The demo row's model (`tiny-qwen3-gsm8k`) is instead the tiny architecture
trained, here, in seconds, on the shipped questions (`rows/data/gsm8k-tiny.jsonl`):
prompt `Question: <q>\\nAnswer:` (the accuracy gate's format), target the
reference answer and EOS. It memorises them — it cannot do arithmetic, and the
demo's gate judges health only, saying so — but it really answers and stops.

Deterministic, so every run and machine builds the same bytes (the digest is
recorded and checked like the random tiny model's):

* the training runs in a fresh interpreter (`python -m rowgate.models.train OUT SPEC`)
  whose environment pins what could change a sum before torch loads: one thread
  (no reduction split across threads), ATen's non-vectorised CPU kernels
  (`ATEN_CPU_CAPABILITY=default`: an AVX-512 machine and an AVX2 one then run
  the same code), MKL's conditional numerical reproducibility
  (`MKL_CBWR=COMPATIBLE`: the same GEMM path on every x86 CPU) and
  `torch.use_deterministic_algorithms(True)`;
* float64 throughout, full batch, a fixed number of Adam steps from the random
  tiny model's seeded weights; no data order, dropout or sampling;
* the result is rounded to values bfloat16 can hold (stored as float32), so a
  last-bit difference of a machine's libm (`exp` in softmax and SiLU — the one
  thing not pinned) moves no stored byte unless a weight sits on a rounding
  boundary of 8 mantissa bits.

Whether it learned is checked, not assumed: after training, every target token
must have probability >= `MIN_TOP_PROB` in a float32 forward, or the build
fails. The accuracy gate samples at temperature 1.0 with top-p 0.95: a token of
probability >= 0.95 is then the only candidate, so the answers come out as
trained whatever the sampling seed.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

from rowgate.models.tiny import (
    EOS_TOKEN,
    UNK_TOKEN,
    ModelError,
    TinyModelSpec,
    TrainSpec,
    seeded_weights,
    write_files,
)

PROMPT_FORMAT = "Question: {question}\nAnswer:"
"""The accuracy gate's prompt (zero-shot completion); trained on exactly this."""
MIN_TOP_PROB = 0.99
"""Every trained target token must be at least this likely after training."""
Tensor = Any
"""torch is an optional dependency, untyped for mypy here."""
Weights = dict[str, Tensor]


# ------------------------------------------------------------------ data


def read_examples(path: Path) -> list[tuple[str, str]]:
    """(prompt, answer) per line of a GSM8K-format JSONL file."""
    try:
        lines = path.read_text().splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise ModelError(f"training data {path}: cannot read ({exc})") from exc
    out = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
            out.append((PROMPT_FORMAT.format(question=rec["question"]), str(rec["answer"])))
        except (ValueError, KeyError, TypeError) as exc:
            raise ModelError(f"training data {path}:{n}: expected a JSON object with question "
                             f"and answer") from exc
    if not out:
        raise ModelError(f"training data {path}: no examples")
    return out


def vocabulary(examples: list[tuple[str, str]], size: int) -> dict[str, int]:
    """EOS, UNK, every whitespace-split word of the data (sorted), then `t<i>` fillers
    up to `size`, so the shape (and the workload's random-id prompts) stay the tiny model's."""
    words = sorted({w for prompt, answer in examples for w in (prompt + " " + answer).split()})
    if len(words) + 2 > size:
        raise ModelError(f"training data has {len(words)} distinct words; vocab_size {size} "
                         f"holds {size - 2}")
    vocab = {EOS_TOKEN: 0, UNK_TOKEN: 1}
    vocab.update({w: i for i, w in enumerate(words, 2)})
    filler = (f"t{i}" for i in range(size * 2) if f"t{i}" not in vocab)
    while len(vocab) < size:
        vocab[next(filler)] = len(vocab)
    return vocab


def sequences(examples: list[tuple[str, str]], vocab: dict[str, int]) -> list[tuple[list[int], int]]:
    """(token ids of prompt + answer + EOS, prompt length) per example."""
    out = []
    for prompt, answer in examples:
        p = [vocab[w] for w in prompt.split()]
        out.append((p + [vocab[w] for w in answer.split()] + [vocab[EOS_TOKEN]], len(p)))
    return out


# ------------------------------------------------------------ the forward


def _hidden(w: Weights, ids: Tensor, cfg: TinyModelSpec) -> Tensor:
    """Qwen3's forward (as vLLM and the reference engine compute it) over a batch
    [B, T] of right-padded sequences with causal attention, up to the final norm:
    [B, T, hidden]. The lm_head is applied only where a loss is taken."""
    import torch
    import torch.nn.functional as F

    b, t = ids.shape
    d, nh, nkv = cfg.head_dim, cfg.num_heads, cfg.num_kv_heads
    dtype = w["model.embed_tokens.weight"].dtype

    def norm(x: Tensor, weight: Tensor) -> Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + cfg.rms_norm_eps) * weight

    inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, d, 2, dtype=torch.int64).to(dtype) / d))
    freqs = torch.outer(torch.arange(t, dtype=dtype), inv_freq)
    cos, sin = freqs.cos()[None, :, None, :], freqs.sin()[None, :, None, :]

    def rope(x: Tensor) -> Tensor:
        x1, x2 = x[..., : d // 2], x[..., d // 2:]
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)

    x = w["model.embed_tokens.weight"][ids]
    for i in range(cfg.num_layers):
        p = f"model.layers.{i}."
        a = norm(x, w[p + "input_layernorm.weight"])
        q = (a @ w[p + "self_attn.q_proj.weight"].T).view(b, t, nh, d)
        k = (a @ w[p + "self_attn.k_proj.weight"].T).view(b, t, nkv, d)
        v = (a @ w[p + "self_attn.v_proj.weight"].T).view(b, t, nkv, d)
        q = rope(norm(q, w[p + "self_attn.q_norm.weight"]))
        k = rope(norm(k, w[p + "self_attn.k_norm.weight"]))
        k, v = (z.repeat_interleave(nh // nkv, 2) for z in (k, v))
        scores = torch.einsum("bqhd,bkhd->bhqk", q, k) * d ** -0.5
        causal = torch.ones(t, t, dtype=torch.bool).triu(1)
        att = scores.masked_fill(causal, float("-inf")).softmax(-1)
        o = torch.einsum("bhqk,bkhd->bqhd", att, v).reshape(b, t, nh * d)
        x = x + o @ w[p + "self_attn.o_proj.weight"].T
        m = norm(x, w[p + "post_attention_layernorm.weight"])
        gate, up = m @ w[p + "mlp.gate_proj.weight"].T, m @ w[p + "mlp.up_proj.weight"].T
        x = x + (F.silu(gate) * up) @ w[p + "mlp.down_proj.weight"].T
    return norm(x, w["model.norm.weight"])


def _batch(seqs: list[tuple[list[int], int]]) -> tuple[Tensor, Tensor, Tensor]:
    """ids [B, T] (EOS-padded), targets [B, T] (next token), mask [B, T] (answer positions)."""
    import torch

    t = max(len(s) for s, _ in seqs)
    ids = torch.zeros(len(seqs), t, dtype=torch.int64)
    mask = torch.zeros(len(seqs), t, dtype=torch.bool)
    for r, (s, plen) in enumerate(seqs):
        ids[r, : len(s)] = torch.tensor(s)
        mask[r, plen - 1: len(s) - 1] = True  # predict each answer token and the EOS
    targets = torch.roll(ids, -1, dims=1)
    return ids, targets, mask


def _bf16_grid(x: Tensor) -> Tensor:
    """Round to the nearest bfloat16 value (ties to even), kept as float32."""
    import torch

    return x.to(torch.float32).to(torch.bfloat16).to(torch.float32)


def train(spec: TrainSpec, seqs: list[tuple[list[int], int]]) -> tuple[Weights, float]:
    """Trained float32 weights and the smallest target-token probability reached."""
    import torch

    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    w = {k: v.to(torch.float64).requires_grad_(True) for k, v in seeded_weights(spec.init).items()}
    ids, targets, mask = _batch(seqs)
    opt = torch.optim.Adam(list(w.values()), lr=spec.lr)
    for _ in range(spec.steps):
        opt.zero_grad(set_to_none=True)
        logits = _hidden(w, ids, spec.init)[mask] @ w["lm_head.weight"].T
        loss = torch.nn.functional.cross_entropy(logits, targets[mask])
        loss.backward()  # type: ignore[no-untyped-call]  # torch is Any here
        opt.step()
    out = {k: _bf16_grid(v.detach()).contiguous() for k, v in w.items()}
    with torch.no_grad():
        probs = (_hidden(out, ids, spec.init)[mask] @ out["lm_head.weight"].T).softmax(-1)
        low = float(probs.gather(1, targets[mask][:, None]).min().item())
    return out, low


# ------------------------------------------------------- the subprocess


def main(out: str, spec_json: str) -> None:
    """Train and write the model directory `out` (model.build_trained_model runs this
    in a fresh interpreter with model.DETERMINISTIC_ENV); print the report as JSON."""
    spec = TrainSpec.from_json(spec_json)
    examples = read_examples(spec.dataset_path())
    vocab = vocabulary(examples, spec.init.vocab_size)
    weights, low = train(spec, sequences(examples, vocab))
    if not math.isfinite(low) or low < MIN_TOP_PROB:
        raise SystemExit(f"training did not converge: the least likely target token has "
                         f"probability {low:.4f} < {MIN_TOP_PROB}")
    write_files(spec.init, Path(out), weights, vocab)
    print(json.dumps({"min_target_probability": round(low, 6)}))


if __name__ == "__main__":  # pragma: no cover - the subprocess of model.build_trained_model
    main(sys.argv[1], sys.argv[2])
