"""DeepSeek-V3 / Kimi K2 config.json parsing: the K2 and K2.5/K2.6 wrapper layouts, the DFlash
drafter for it, and refusals of what the engine does not implement. Parsed only, never built."""

from __future__ import annotations

import pytest

from dflash_core.models.architectures import target_config
from dflash_core.models.config import CheckpointError, DrafterConfig, ModelConfig
from dflash_core.models.deepseek_config import DeepseekConfig
from dflash_core.models.int4 import Int4Scheme
from dflash_core.models.yarn import YarnScaling


def int4_quantization() -> dict:
    return {"quant_method": "compressed-tensors", "format": "pack-quantized",
            "quantization_status": "compressed",
            "config_groups": {"group_0": {
                "targets": ["Linear"], "input_activations": None, "output_activations": None,
                "weights": {"num_bits": 4, "type": "int", "symmetric": True, "strategy": "group",
                            "group_size": 32, "dynamic": False, "actorder": None,
                            "observer": "minmax"}}},
            "ignore": ["lm_head", "re:.*self_attn.*"], "kv_cache_scheme": None}


def kimi_k2_thinking() -> dict:
    """In the shape of the K2-Thinking config.json (the text model; INT4 routed experts)."""
    return {
        "architectures": ["DeepseekV3ForCausalLM"], "model_type": "kimi_k2",
        "auto_map": {"AutoConfig": "configuration_deepseek.DeepseekV3Config"},
        "vocab_size": 163840, "hidden_size": 7168, "intermediate_size": 18432,
        "moe_intermediate_size": 2048, "num_hidden_layers": 61, "num_attention_heads": 64,
        "num_key_value_heads": 64, "n_shared_experts": 1, "n_routed_experts": 384,
        "routed_scaling_factor": 2.827, "kv_lora_rank": 512, "q_lora_rank": 1536,
        "qk_rope_head_dim": 64, "v_head_dim": 128, "qk_nope_head_dim": 128,
        "topk_method": "noaux_tc", "n_group": 1, "topk_group": 1, "num_experts_per_tok": 8,
        "moe_layer_freq": 1, "first_k_dense_replace": 1, "norm_topk_prob": True,
        "scoring_func": "sigmoid", "aux_loss_alpha": 0.001, "seq_aux": True,
        "hidden_act": "silu", "max_position_embeddings": 262144, "rms_norm_eps": 1e-5,
        "rope_theta": 50000.0, "attention_bias": False, "attention_dropout": 0.0,
        "tie_word_embeddings": False, "num_nextn_predict_layers": 0,
        "rope_scaling": {"beta_fast": 1.0 * 32, "beta_slow": 1.0, "factor": 64.0,
                         "mscale": 1.0, "mscale_all_dim": 1.0,
                         "original_max_position_embeddings": 4096, "type": "yarn"},
        "quantization_config": int4_quantization(),
        "torch_dtype": "bfloat16", "bos_token_id": 163584, "eos_token_id": 163585,
    }


def kimi_k26() -> dict:
    """The K2.5 / K2.6 multimodal wrapper: the text model under text_config."""
    text = kimi_k2_thinking()
    text.pop("architectures")
    quant = text.pop("quantization_config")
    return {"architectures": ["KimiK25ForConditionalGeneration"], "model_type": "kimi_k25",
            "text_config": text, "vision_config": {"model_type": "moonvit", "hidden_size": 1152},
            "quantization_config": quant, "media_placeholder_token_id": 163605}


def kimi_drafter() -> dict:
    """In the shape of the Kimi-K2.6 DFlash drafter config.json (Qwen3-style GQA + YaRN)."""
    return {
        "architectures": ["DFlashDraftModel"], "model_type": "qwen3", "block_size": 8,
        "hidden_size": 7168, "intermediate_size": 18432, "num_hidden_layers": 6,
        "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 128,
        "rms_norm_eps": 1e-5, "rope_theta": 50000.0, "vocab_size": 163840,
        "max_position_embeddings": 262144, "num_target_layers": 61,
        "rope_scaling": {"rope_type": "yarn", "factor": 64.0, "beta_fast": 32.0,
                         "beta_slow": 1.0, "original_max_position_embeddings": 4096},
        "dflash_config": {"mask_token_id": 163838, "target_layer_ids": [1, 12, 24, 35, 47, 58]},
    }


def test_kimi_k2_thinking_config_is_read():
    cfg = target_config(kimi_k2_thinking())
    assert isinstance(cfg, DeepseekConfig)
    assert (cfg.num_attention_heads, cfg.kv_lora_rank, cfg.qk_rope_head_dim) == (64, 512, 64)
    assert (cfg.n_routed_experts, cfg.num_experts_per_tok, cfg.n_shared_experts) == (384, 8, 1)
    assert cfg.routed_scaling_factor == 2.827 and cfg.rope_theta == 50000.0
    assert cfg.rope_scaling == YarnScaling(64.0, 4096, 32.0, 1.0, 1.0, 1.0)
    assert cfg.quantization == Int4Scheme(32)
    assert cfg.weight_prefix == ""
    assert [cfg.is_moe_layer(i) for i in (0, 1, 60)] == [False, True, True]
    # YaRN's mscale_all_dim correction: 192**-0.5 * (0.1 ln 64 + 1)**2
    assert cfg.softmax_scale == pytest.approx(192**-0.5 * (0.1 * 4.158883 + 1) ** 2, rel=1e-6)


def test_kimi_k26_wrapper_reads_the_text_config_and_its_weight_prefix():
    cfg = target_config(kimi_k26())
    assert isinstance(cfg, DeepseekConfig)
    assert cfg.weight_prefix == "language_model."
    assert cfg.quantization == Int4Scheme(32)  # the wrapper's top-level quantization_config
    assert cfg.hidden_size == 7168 and cfg.num_hidden_layers == 61


def test_deepseek_v3_config_without_quantization_has_bf16_experts():
    raw = kimi_k2_thinking() | {"model_type": "deepseek_v3", "num_attention_heads": 128,
                                "num_key_value_heads": 128, "n_group": 8, "topk_group": 4,
                                "n_routed_experts": 256}
    raw.pop("quantization_config")
    cfg = target_config(raw)
    assert cfg.quantization is None and (cfg.n_group, cfg.topk_group) == (8, 4)


def test_a_transformers_v5_config_with_rope_parameters_is_read():
    raw = kimi_k2_thinking()
    raw["rope_parameters"] = raw.pop("rope_scaling") | {"rope_theta": 50000.0}
    raw.pop("rope_theta")
    cfg = target_config(raw)
    assert cfg.rope_theta == 50000.0 and cfg.rope_scaling.factor == 64.0


def test_deepseek_config_round_trips_through_to_dict():
    cfg = target_config(kimi_k2_thinking())
    assert target_config(cfg.to_dict()) == cfg


def test_qwen3_configs_still_pick_the_qwen3_architecture():
    raw = {"model_type": "qwen3", "vocab_size": 10, "hidden_size": 8, "intermediate_size": 16,
           "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1}
    assert isinstance(target_config(raw), ModelConfig)


def test_the_kimi_dflash_drafter_config_loads_with_yarn_and_fits_the_target():
    drafter = DrafterConfig.from_dict(kimi_drafter())
    assert drafter.layers.rope_scaling == YarnScaling(64.0, 4096)
    assert drafter.target_layer_ids == [1, 12, 24, 35, 47, 58] and drafter.block_size == 8
    drafter.check_target(target_config(kimi_k26()))  # hidden size, taps, vocab, mask token


@pytest.mark.parametrize("change, message", [
    ({"scoring_func": "softmax"}, "scoring_func 'softmax' is not supported"),
    ({"topk_method": "group_limited_greedy"}, "topk_method"),
    ({"hidden_act": "gelu"}, "hidden_act"),
    ({"attention_bias": True}, "attention_bias"),
    ({"num_key_value_heads": 8}, "num_key_value_heads must equal"),
    ({"n_group": 5}, "n_group must divide"),
    ({"topk_group": 2}, "topk_group"),
    ({"qk_rope_head_dim": 63}, "even"),
    ({"rope_scaling": {"type": "longrope", "factor": 2.0}}, "'longrope' is not supported"),
    ({"kv_lora_rank": "512"}, "kv_lora_rank must be an integer"),
])
def test_what_the_engine_does_not_implement_is_refused(change, message):
    with pytest.raises(CheckpointError, match=message):
        target_config(kimi_k2_thinking() | change)


@pytest.mark.parametrize("change, message", [
    ({"format": "float-quantized"}, "format 'float-quantized'"),
    ({"quant_method": "fp8"}, "quant_method 'fp8'"),
])
def test_other_quantisation_is_refused(change, message):
    raw = kimi_k2_thinking()
    raw["quantization_config"] |= change
    with pytest.raises(CheckpointError, match=message):
        target_config(raw)


def test_asymmetric_int4_is_refused():
    raw = kimi_k2_thinking()
    raw["quantization_config"]["config_groups"]["group_0"]["weights"]["symmetric"] = False
    with pytest.raises(CheckpointError, match="symmetric"):
        target_config(raw)
