"""The op's host side: variant names, the split plan, argument validation."""

from __future__ import annotations

import pytest
import torch

from pipeline.ops import decode_attention as op


def test_variant_names_map_to_kernels():
    assert op.kernel_name("e5m2", 128, 4, "e5m2_pipelined") == "split_kv_e5m2_d128_g4_pipe"
    assert op.kernel_name("bf16", 64, 8, "baseline") == "split_kv_bf16_d64_g8_base"
    with pytest.raises(ValueError, match="variant: expected one of"):
        op.variant_suffix("e5m2_fast")


@pytest.mark.parametrize("batch,length,page", [(1, 1, 16), (1, 1024, 64), (4, 17, 16),
                                               (16, 16384, 64), (16, 18227, 16)])
@pytest.mark.parametrize("group,dim", [(4, 128), (8, 128), (4, 64), (8, 64)])
def test_plan_covers_every_token_and_fits_shared_memory(batch, length, page, group, dim):
    p = op.plan(batch, 8 // (group // 4), group, dim, page, length, 132, "e5m2")
    assert p.chunk % 64 == 0 and p.chunk % page == 0
    assert p.splits * p.chunk >= length > (p.splits - 1) * p.chunk
    for variant in ("baseline", "pipelined"):
        assert op.smem_bytes(p.chunk, group, dim, "e5m2", variant) <= op.SMEM_LIMIT
    # the chunk fixes the merge order: it must not depend on the variant
    assert op.plan(batch, 8, group, dim, page, length, 132, "e5m2").chunk == op.plan(
        batch, 8, group, dim, page, length, 132, "e5m2").chunk


def test_validation_names_the_argument():
    q = torch.zeros(2, 32, 128, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="^q: expected a CUDA tensor, got cpu"):
        op.validate(q, q, q, q, q, 16)
    with pytest.raises(ValueError, match="^q: expected a CUDA tensor, got list"):
        op.validate([], q, q, q, q, 16)
