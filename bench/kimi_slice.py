"""The Kimi K2.6 layer slice of bench/engine_bench.py: the real dimensions (MLA with 64 heads,
a 512 + 64 latent, 384 routed INT4 experts top-8 plus a shared one, YaRN x64), a few layers
(layer 0 dense, the rest MoE), random weights. On a GPU it is timed like the Qwen3 shapes; on a
CPU it would not fit, so it runs on the meta device: every verify's shapes are checked and its
bytes counted, nothing is timed."""

from __future__ import annotations

import torch

from dflash_core import Target
from dflash_core.models.deepseek_config import DeepseekConfig
from dflash_core.models.deepseek_target import deepseek_target
from dflash_core.models.int4 import Int4Experts, Int4Scheme
from dflash_core.models.yarn import YarnScaling

KIMI_K26 = dict(vocab_size=163840, hidden_size=7168, intermediate_size=18432,
                moe_intermediate_size=2048, num_attention_heads=64, kv_lora_rank=512,
                qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128, q_lora_rank=1536,
                n_routed_experts=384, n_shared_experts=1, num_experts_per_tok=8, n_group=1,
                topk_group=1, first_k_dense_replace=1, routed_scaling_factor=2.827,
                rms_norm_eps=1e-5, rope_theta=50_000.0,
                rope_scaling=YarnScaling(64.0, 4096, mscale=1.0, mscale_all_dim=1.0),
                quantization=Int4Scheme(group_size=32))
SLICE_LAYERS = 3  # one dense + two MoE layers: ~23 GB in BF16 + INT4


def kimi_slice_config(layers: int = SLICE_LAYERS) -> DeepseekConfig:
    return DeepseekConfig(num_hidden_layers=layers, **KIMI_K26)


def build_kimi_slice(device: str, dtype: torch.dtype, layers: int = SLICE_LAYERS) -> Target:
    """Allocated in `dtype` on `device` ("meta": shapes only). Random normal(0, 0.02) weights,
    random INT4 words with scales of 0.002 (about the magnitude of those weights)."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            target = deepseek_target(kimi_slice_config(layers)).eval()
    finally:
        torch.set_default_dtype(previous)
    if device != "meta":
        _randomise(target)
    return target


@torch.no_grad()
def _randomise(target: Target) -> None:
    torch.manual_seed(0)
    for p in target.parameters():
        p.normal_(0, 0.02)
    for module in target.modules():
        if isinstance(module, Int4Experts):
            for name in ("gate_up", "down"):
                packed = getattr(module, f"{name}_packed")
                packed.copy_(torch.randint_like(packed, -2**31, 2**31 - 1))
                getattr(module, f"{name}_scale").fill_(0.002)
