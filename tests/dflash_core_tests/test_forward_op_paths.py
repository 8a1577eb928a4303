"""The shorter op paths of a forward against the formulas they replace: RoPE as one roll with
tables made once (bit for bit), RMSNorm as one op in fp32 (bit for bit on CPU) and still rounded
before the weight in bf16, one softmax over prefix and new keys (the two merged partials, up to
rounding), and no dtype cast dispatched in fp32."""

from __future__ import annotations

import pytest
import torch

from dflash_core.models import attention
from dflash_core.models.layers import RMSNorm, apply_rope, head_rope, rope_tables, rotate
from dflash_core.runtime.profile import OpCounter

GEN = torch.Generator().manual_seed(7)


def _formula_rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rotate_with_shared_tables_is_apply_rope_bit_for_bit(dtype):
    positions = torch.tensor([[0, 1, 1, 2, 5, 9], [3, 4, 4, 4, 7, 200]])
    cos, sin = rope_tables(16, 10_000.0, positions)
    x = torch.randn(2, 3, 6, 16, generator=GEN).to(dtype)
    assert torch.equal(rotate(x, head_rope((cos, sin), dtype)), apply_rope(x, cos, sin))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rms_norm_is_the_qwen3_formula_bit_for_bit(dtype):
    norm = RMSNorm(32, 1e-6).to(dtype)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(32, generator=GEN))
    for scale in (1e-3, 1.0, 300.0):
        x = (torch.randn(4, 5, 32, generator=GEN) * scale).to(dtype)
        assert torch.equal(norm(x), _formula_rms(x, norm.weight, norm.eps))


def test_one_softmax_over_prefix_and_tree_equals_the_merged_partials():
    b, hq, hkv, n, s, d = 3, 4, 2, 5, 11, 8
    q = torch.randn(b, hq, n, d, generator=GEN)
    k_new, v_new = (torch.randn(b, hkv, n, d, generator=GEN) for _ in range(2))
    prefix = tuple(torch.randn(b, hkv, s, d, generator=GEN) for _ in range(2))
    lens = torch.tensor([0, 4, 11])  # an empty prefix, a partial one, a full one
    mask = torch.rand(b, n, n, generator=GEN) < 0.5
    mask |= torch.eye(n, dtype=torch.bool)  # every node sees itself
    out = attention.attend(q, prefix, lens, k_new, v_new, mask)
    # The reference: each part's own softmax, merged by log-sum-exp.
    groups = hq // hkv
    qg = q.reshape(b, hkv, groups * n, d) * d**-0.5
    tree = attention._additive(mask)[:, None].repeat(1, 1, groups, 1)
    length = attention._additive(torch.arange(s) < lens[:, None])[:, None, None]
    merged, _ = attention._merge(*attention._partial(qg, k_new, v_new, tree),
                                 *attention._partial(qg, *prefix, length))
    torch.testing.assert_close(out, merged.reshape(b, hq, n, d), atol=1e-6, rtol=1e-5)


def test_an_fp32_attention_layer_dispatches_no_dtype_cast():
    b, hq, hkv, n, s, d = 2, 4, 2, 3, 7, 8
    q = torch.randn(b, hq, n, d, generator=GEN)
    k_new, v_new = (torch.randn(b, hkv, n, d, generator=GEN) for _ in range(2))
    prefix = tuple(torch.randn(b, hkv, s, d, generator=GEN) for _ in range(2))
    mask = torch.ones(n, n, dtype=torch.bool).tril().expand(b, n, n)
    rope = head_rope(rope_tables(d, 10_000.0, torch.arange(n).expand(b, n)), torch.float32)
    norm = RMSNorm(d, 1e-6)
    counter = OpCounter()
    with torch.inference_mode(), counter:
        attention.attend(rotate(norm(q), rope), prefix, torch.tensor([3, 7]), k_new, v_new,
                         mask)
    casts = {op for (_, op) in counter.names if op.startswith(("to.", "_to_copy"))}
    assert casts == set() and counter.ops["host"] > 0
