"""The tiny model: deterministic bytes, a digest that tracks them, loadable offline."""

from __future__ import annotations

import json

import pytest

from rowgate.models.tiny import (
    ModelError,
    TinyModelSpec,
    build_tiny_model,
    model_digest,
    model_info,
    perturbed_copy,
)

SMALL = TinyModelSpec(vocab_size=128, hidden_size=64, intermediate_size=96, head_dim=32)


def test_same_spec_same_digest_in_separate_builds(tmp_path):
    a = build_tiny_model(SMALL, root=tmp_path / "a")
    b = build_tiny_model(SMALL, root=tmp_path / "b")
    assert a.digest == b.digest
    assert a.digest.startswith("sha256:") and len(a.digest) == 71
    for name in ("model.safetensors", "tokenizer.json", "config.json"):
        assert (a.path / name).read_bytes() == (b.path / name).read_bytes()


def test_other_seed_other_digest(tmp_path):
    a = build_tiny_model(SMALL, root=tmp_path)
    b = build_tiny_model(TinyModelSpec(**{**SMALL.__dict__, "seed": 1}), root=tmp_path)
    assert a.path != b.path
    assert a.digest != b.digest


def test_info_names_vocab_and_special_ids(tmp_path):
    info = build_tiny_model(SMALL, root=tmp_path)
    assert info.vocab_size == 128
    assert info.eos_token_id == 0
    assert info.special_ids == (0, 1)
    assert info.describe()["model_digest"] == info.digest


def test_cache_reused_and_rebuilt_when_tampered(tmp_path):
    first = build_tiny_model(SMALL, root=tmp_path)
    stamp = (first.path / "model.safetensors").stat().st_mtime_ns
    assert build_tiny_model(SMALL, root=tmp_path).path == first.path
    assert (first.path / "model.safetensors").stat().st_mtime_ns == stamp  # reused
    config = json.loads((first.path / "config.json").read_text())
    (first.path / "config.json").write_text(json.dumps({**config, "rms_norm_eps": 0.1}))
    rebuilt = build_tiny_model(SMALL, root=tmp_path)
    assert rebuilt.digest == first.digest  # the tampered copy was replaced, not trusted


def test_digest_changes_with_any_file(tmp_path):
    info = build_tiny_model(SMALL, root=tmp_path)
    tok = info.path / "tokenizer_config.json"
    tok.write_text(tok.read_text() + " ")
    assert model_digest(info.path) != info.digest


def test_missing_file_is_a_model_error(tmp_path):
    info = build_tiny_model(SMALL, root=tmp_path)
    (info.path / "tokenizer.json").unlink()
    with pytest.raises(ModelError, match="tokenizer.json"):
        model_info(info.path)


def test_perturbed_copy_changes_one_weight(tmp_path):
    from safetensors.torch import load_file

    info = build_tiny_model(SMALL, root=tmp_path)
    bad = perturbed_copy(info.path, tmp_path / "bad", "lm_head.weight", (5, 3), 0.5)
    assert bad.digest != info.digest
    a = load_file(str(info.path / "model.safetensors"))
    b = load_file(str(bad.path / "model.safetensors"))
    changed = [(k, (a[k] != b[k]).sum().item()) for k in a if (a[k] != b[k]).any()]
    assert changed == [("lm_head.weight", 1)]
    with pytest.raises(ModelError, match="no tensor"):
        perturbed_copy(info.path, tmp_path / "bad2", "nope.weight", (0,), 1.0)


def test_transformers_loads_it_offline(tmp_path, monkeypatch):
    transformers = pytest.importorskip("transformers")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    info = build_tiny_model(SMALL, root=tmp_path)
    tok = transformers.AutoTokenizer.from_pretrained(info.path)
    assert tok.eos_token_id == 0 and len(tok) == 128
    assert tok.decode([5, 6]) == "t5 t6"
    model = transformers.AutoModelForCausalLM.from_pretrained(info.path)
    assert type(model).__name__ == "Qwen3ForCausalLM"
    assert sum(p.numel() for p in model.parameters()) < 2_000_000


BUILD_IN_A_PROCESS = """
import json, sys, time
from pathlib import Path
from rowgate.models import tiny
root, go = Path(sys.argv[1]), Path(sys.argv[2])
built = []
make = tiny._build_tiny
tiny._build_tiny = lambda *a: (built.append(1), make(*a))[1]
print("ready", flush=True)
while not go.exists():  # both start building at once
    time.sleep(0.01)
info = tiny.build_tiny_model(tiny.TinyModelSpec(), root)
print(json.dumps({"digest": info.digest, "built": len(built)}))
"""


def test_two_processes_building_the_same_model_build_it_once(tmp_path):
    import json
    import subprocess
    import sys

    go = tmp_path / "go"
    procs = [subprocess.Popen([sys.executable, "-c", BUILD_IN_A_PROCESS, str(tmp_path / "m"),
                               str(go)], stdout=subprocess.PIPE, text=True) for _ in range(2)]
    for p in procs:
        assert p.stdout is not None and p.stdout.readline().strip() == "ready"
    go.write_text("")
    done = [json.loads(p.communicate(timeout=300)[0]) for p in procs]
    assert done[0]["digest"] == done[1]["digest"]
    # one process built it; the other waited and reused it (never replacing a model
    # another process may be loading)
    assert sorted(d["built"] for d in done) == [0, 1]
