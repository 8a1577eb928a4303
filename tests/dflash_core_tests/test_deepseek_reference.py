"""Our DeepSeek-V3 target against transformers' own DeepseekV3ForCausalLM (fp32, tiny random
models with odd sizes), loaded from the checkpoint transformers saved, unchanged."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from dflash_core import Engine, EngineConfig, SamplingParams, Spec
from dflash_core.models.loader import load_target
from dflash_core.models.step import Step

VOCAB = 53
YARN = {"rope_type": "yarn", "rope_theta": 10_000.0, "factor": 4.0, "beta_fast": 32,
        "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 0.7,
        "original_max_position_embeddings": 32}
PLAIN = {"rope_type": "default", "rope_theta": 10_000.0}
VARIANTS = [pytest.param((q, y), id=f"qlora-{'on' if q else 'off'}-yarn-{'on' if y else 'off'}")
            for q in (True, False) for y in (True, False)]


def hf_model(q_lora: bool, yarn: bool, seed: int = 0):
    """3 layers (the first dense), 8 routed experts top-2 in 2 groups, 1 shared expert."""
    config = transformers.DeepseekV3Config(
        vocab_size=VOCAB, hidden_size=36, intermediate_size=44, moe_intermediate_size=10,
        num_hidden_layers=3, num_attention_heads=3, num_key_value_heads=3, n_shared_experts=1,
        n_routed_experts=8, num_experts_per_tok=2, n_group=2, topk_group=1,
        first_k_dense_replace=1, routed_scaling_factor=2.5, kv_lora_rank=14,
        q_lora_rank=20 if q_lora else None, qk_nope_head_dim=10, qk_rope_head_dim=6,
        v_head_dim=9, max_position_embeddings=128, rope_parameters=YARN if yarn else PLAIN,
        eos_token_id=None, pad_token_id=0, experts_implementation="eager",
        attn_implementation="eager")  # the plain loops: the reference, not a fast path
    torch.manual_seed(seed)
    model = transformers.DeepseekV3ForCausalLM(config).eval()
    with torch.no_grad():  # weights large enough to make routing and next tokens decisive
        for name, param in model.named_parameters():
            param.normal_(1.0, 0.1) if "norm" in name else param.normal_(0.0, 0.3)
        for module in model.modules():
            if hasattr(module, "e_score_correction_bias"):
                module.e_score_correction_bias.normal_(0.0, 0.2)
    return model


@pytest.fixture(scope="module", params=VARIANTS)
def pair(request, tmp_path_factory):
    reference = hf_model(*request.param)
    folder = tmp_path_factory.mktemp("hf_deepseek")
    reference.save_pretrained(folder, max_shard_size="40KB")  # sharded, with an index
    return reference, load_target(folder), folder


def _prompt(length: int, seed: int) -> torch.Tensor:
    return torch.randint(1, VOCAB, (1, length), generator=torch.Generator().manual_seed(seed))


def test_transformers_checkpoint_is_sharded_with_real_key_names(pair):
    _, _, folder = pair
    assert (folder / "model.safetensors.index.json").is_file()
    index = (folder / "model.safetensors.index.json").read_text()
    for key in ("model.layers.1.self_attn.kv_a_proj_with_mqa.weight",
                "model.layers.1.self_attn.kv_a_layernorm.weight",
                "model.layers.1.mlp.gate.e_score_correction_bias",
                "model.layers.2.mlp.shared_experts.down_proj.weight",
                "model.layers.2.mlp.experts.7.up_proj.weight",
                "model.layers.0.mlp.gate_proj.weight"):
        assert f'"{key}"' in index


@pytest.mark.parametrize("length", [1, 23])
def test_prefill_logits_equal_transformers(pair, length):
    reference, ours, _ = pair
    ids = _prompt(length, seed=length)
    with torch.no_grad():
        expected = reference(ids).logits[0]
        cache = ours.allocate_cache(1, length)
        hidden, _ = ours(ids, Step.causal(torch.zeros(1, dtype=torch.long), length, 0), cache)
    torch.testing.assert_close(ours.logits(hidden)[0], expected, atol=1e-4, rtol=1e-4)


def test_incremental_decode_logits_equal_transformers(pair):
    """Prefill then one token at a time through the latent cache, against the full forward."""
    reference, ours, _ = pair
    ids = _prompt(12, seed=5)
    cache = ours.allocate_cache(1, 12)
    with torch.no_grad():
        expected = reference(ids).logits[0]
        got = []
        for t in range(12):
            step = Step.causal(torch.tensor([t]), 1, t)
            hidden, _ = ours(ids[:, t : t + 1], step, cache)
            got.append(ours.logits(hidden)[0, 0])
    torch.testing.assert_close(torch.stack(got), expected, atol=1e-4, rtol=1e-4)


def test_greedy_generation_equals_transformers_generate(pair):
    reference, ours, _ = pair
    engine = Engine(ours, None, EngineConfig(max_batch=1, max_context=64, max_tree_nodes=4))
    for seed, length in ((1, 7), (2, 16)):
        ids = _prompt(length, seed)
        expected = reference.generate(ids, max_new_tokens=20, do_sample=False)[0, length:]
        got = engine.generate([ids[0].tolist()], SamplingParams(max_tokens=20), Spec.none())
        assert got.tokens[0] == expected.tolist()


@pytest.mark.parametrize("extra", [{}, {"mscale": 1.0, "mscale_all_dim": 1.0},
                                   {"mscale": 0.9, "mscale_all_dim": 0.5, "truncate": False}],
                         ids=["plain", "mscale-equal", "mscale-unequal-untruncated"])
def test_qwen3_yarn_tables_equal_transformers(extra):
    """The drafter's YaRN (Qwen3 layers, as the Kimi DFlash drafters) against transformers'."""
    from dflash_core.models.config import ModelConfig
    from dflash_core.models.layers import rope_tables

    rope = {"rope_type": "yarn", "rope_theta": 50_000.0, "factor": 64.0, "beta_fast": 32.0,
            "beta_slow": 1.0, "original_max_position_embeddings": 64, **extra}
    config = transformers.Qwen3Config(hidden_size=64, num_attention_heads=4, head_dim=16,
                                      num_key_value_heads=2,
                                      max_position_embeddings=4096, rope_parameters=rope)
    positions = torch.tensor([[0, 3, 17, 63, 64, 1000, 4095]])
    reference = transformers.models.qwen3.modeling_qwen3.Qwen3RotaryEmbedding(config)
    want_cos, want_sin = reference(torch.zeros(1, dtype=torch.float32), positions)
    ours = ModelConfig.from_dict(config.to_dict())
    cos, sin = rope_tables(ours.head_dim, ours.rope_theta, positions, ours.rope_scaling)
    torch.testing.assert_close(cos, want_cos, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(sin, want_sin, atol=1e-5, rtol=1e-5)
