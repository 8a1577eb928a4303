"""Config parsing: HF Qwen3 / Qwen3-MoE config.json dicts and DFlash drafter configs.

The big configs are only parsed here, never instantiated as models.
"""

from __future__ import annotations

import json

import pytest

from dflash_core.models.config import (
    CheckpointError,
    DrafterConfig,
    ModelConfig,
    default_target_layers,
    read_config,
)

# --- realistic public configs (written inline, in the shape of the hub config.json files) -------


def qwen3_8b() -> dict:
    """Qwen3-8B config.json, including keys the engine does not use (they must be ignored)."""
    return {
        "architectures": ["Qwen3ForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": 151643,
        "eos_token_id": 151645,
        "head_dim": 128,
        "hidden_act": "silu",
        "hidden_size": 4096,
        "initializer_range": 0.02,
        "intermediate_size": 12288,
        "max_position_embeddings": 40960,
        "max_window_layers": 36,
        "model_type": "qwen3",
        "num_attention_heads": 32,
        "num_hidden_layers": 36,
        "num_key_value_heads": 8,
        "rms_norm_eps": 1e-06,
        "rope_scaling": None,
        "rope_theta": 1000000,
        "sliding_window": None,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "transformers_version": "4.51.0",
        "use_cache": True,
        "use_sliding_window": False,
        "vocab_size": 151936,
    }


def qwen3_30b_a3b() -> dict:
    """Qwen3-30B-A3B-like MoE config.json."""
    return {
        "architectures": ["Qwen3MoeForCausalLM"],
        "attention_bias": False,
        "decoder_sparse_step": 1,
        "head_dim": 128,
        "hidden_act": "silu",
        "hidden_size": 2048,
        "intermediate_size": 6144,
        "max_position_embeddings": 40960,
        "mlp_only_layers": [],
        "model_type": "qwen3_moe",
        "moe_intermediate_size": 768,
        "norm_topk_prob": True,
        "num_attention_heads": 32,
        "num_experts": 128,
        "num_experts_per_tok": 8,
        "num_hidden_layers": 48,
        "num_key_value_heads": 4,
        "output_router_logits": False,
        "rms_norm_eps": 1e-06,
        "rope_scaling": None,
        "rope_theta": 1000000.0,
        "router_aux_loss_coef": 0.001,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "vocab_size": 151936,
    }


def qwen3_8b_dflash_b16() -> dict:
    """Qwen3-8B-DFlash-b16 drafter config.json: Qwen3 layer fields + block_size + dflash_config."""
    return {
        "architectures": ["DFlashDraftModel"],
        "attention_bias": False,
        "block_size": 16,
        "dflash_config": {"mask_token_id": 151669, "target_layer_ids": [1, 9, 17, 25, 33]},
        "head_dim": 128,
        "hidden_act": "silu",
        "hidden_size": 4096,
        "intermediate_size": 12288,
        "max_position_embeddings": 40960,
        "model_type": "qwen3",
        "num_attention_heads": 32,
        "num_hidden_layers": 5,
        "num_key_value_heads": 8,
        "num_target_layers": 36,
        "rms_norm_eps": 1e-06,
        "rope_theta": 1000000,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "vocab_size": 151936,
    }


REQUIRED = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
)


# --- ModelConfig ------------------------------------------------------------------------------


def test_qwen3_8b_dense():
    cfg = ModelConfig.from_dict(qwen3_8b())
    assert (cfg.vocab_size, cfg.hidden_size, cfg.intermediate_size) == (151936, 4096, 12288)
    assert (cfg.num_hidden_layers, cfg.num_attention_heads, cfg.num_key_value_heads) == (36, 32, 8)
    assert cfg.head_dim == 128
    assert cfg.rope_theta == 1e6
    assert cfg.rms_norm_eps == 1e-6
    assert cfg.tie_word_embeddings is False
    assert cfg.num_experts == 0
    assert not any(cfg.is_moe_layer(i) for i in range(cfg.num_hidden_layers))


def test_qwen3_30b_a3b_moe():
    cfg = ModelConfig.from_dict(qwen3_30b_a3b())
    assert (cfg.vocab_size, cfg.hidden_size, cfg.num_hidden_layers) == (151936, 2048, 48)
    assert (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim) == (32, 4, 128)
    assert (cfg.num_experts, cfg.num_experts_per_tok, cfg.moe_intermediate_size) == (128, 8, 768)
    assert cfg.intermediate_size == 6144
    assert cfg.norm_topk_prob is True
    assert cfg.decoder_sparse_step == 1
    assert cfg.mlp_only_layers == []
    assert all(cfg.is_moe_layer(i) for i in range(48))


def test_explicit_false_optional_values_are_kept():
    """`norm_topk_prob: false` must not fall back to the default True (falsy is not missing)."""
    raw = qwen3_30b_a3b() | {"norm_topk_prob": False, "tie_word_embeddings": True}
    cfg = ModelConfig.from_dict(raw)
    assert cfg.norm_topk_prob is False
    assert cfg.tie_word_embeddings is True


def test_null_optional_values_use_defaults():
    raw = qwen3_8b() | {"rope_theta": None, "rms_norm_eps": None}
    cfg = ModelConfig.from_dict(raw)
    assert cfg.rope_theta == ModelConfig.__dataclass_fields__["rope_theta"].default
    assert cfg.rms_norm_eps == 1e-6


def test_nested_text_config():
    nested = {
        "architectures": ["SomeVLForConditionalGeneration"],
        "model_type": "some_vl",
        "vision_config": {"hidden_size": 1152, "num_hidden_layers": 27},
        "text_config": qwen3_30b_a3b(),
    }
    assert ModelConfig.from_dict(nested) == ModelConfig.from_dict(qwen3_30b_a3b())


def test_head_dim_fallback_is_hidden_over_heads():
    raw = qwen3_30b_a3b()
    del raw["head_dim"]
    assert ModelConfig.from_dict(raw).head_dim == 2048 // 32
    raw["head_dim"] = None
    assert ModelConfig.from_dict(raw).head_dim == 64


def test_explicit_head_dim_wins_over_hidden_over_heads():
    """Qwen3-0.6B: hidden 1024, 16 heads, but head_dim 128 (not 64)."""
    raw = qwen3_8b() | {"hidden_size": 1024, "num_attention_heads": 16,
                        "num_key_value_heads": 8, "num_hidden_layers": 28}
    assert ModelConfig.from_dict(raw).head_dim == 128


def test_is_moe_layer_sparse_step_and_mlp_only_layers():
    raw = qwen3_30b_a3b() | {"num_hidden_layers": 8, "decoder_sparse_step": 2,
                             "mlp_only_layers": [3]}
    cfg = ModelConfig.from_dict(raw)
    # (layer + 1) % 2 == 0 -> 1, 3, 5, 7; layer 3 is forced dense.
    assert [i for i in range(8) if cfg.is_moe_layer(i)] == [1, 5, 7]


def test_is_moe_layer_mlp_only_layers_with_step_one():
    cfg = ModelConfig.from_dict(qwen3_30b_a3b() | {"mlp_only_layers": [0, 47]})
    moe = [i for i in range(48) if cfg.is_moe_layer(i)]
    assert moe == list(range(1, 47))


@pytest.mark.parametrize("name", REQUIRED)
def test_missing_required_field_is_named(name):
    raw = qwen3_8b()
    del raw[name]
    with pytest.raises(CheckpointError, match=name):
        ModelConfig.from_dict(raw)


@pytest.mark.parametrize("name", ["hidden_size", "num_attention_heads"])
def test_missing_required_field_in_text_config_is_named(name):
    text = qwen3_8b()
    del text[name]
    with pytest.raises(CheckpointError, match=name):
        ModelConfig.from_dict({"text_config": text})


def test_heads_not_multiple_of_kv_heads():
    with pytest.raises(CheckpointError, match="num_key_value_heads"):
        ModelConfig.from_dict(qwen3_8b() | {"num_key_value_heads": 5})


@pytest.mark.parametrize("per_tok", [0, 129])
def test_experts_per_token_out_of_range(per_tok):
    with pytest.raises(CheckpointError, match="num_experts_per_tok"):
        ModelConfig.from_dict(qwen3_30b_a3b() | {"num_experts_per_tok": per_tok})


@pytest.mark.parametrize("make", [qwen3_8b, qwen3_30b_a3b])
def test_model_config_to_dict_round_trip(make):
    cfg = ModelConfig.from_dict(make())
    out = cfg.to_dict()
    json.dumps(out)  # a config.json must be plain JSON
    assert ModelConfig.from_dict(out) == cfg
    assert out["model_type"] == make()["model_type"]
    assert out["architectures"] == make()["architectures"]


# --- DrafterConfig ----------------------------------------------------------------------------


def test_dflash_b16_drafter_config():
    cfg = DrafterConfig.from_dict(qwen3_8b_dflash_b16())
    assert cfg.block_size == 16
    assert cfg.target_layer_ids == [1, 9, 17, 25, 33]
    assert cfg.mask_token_id == 151669
    lc = cfg.layers
    assert (lc.num_hidden_layers, lc.hidden_size, lc.intermediate_size) == (5, 4096, 12288)
    assert (lc.num_attention_heads, lc.num_key_value_heads, lc.head_dim) == (32, 8, 128)
    assert lc.num_experts == 0


def test_drafter_config_round_trip():
    cfg = DrafterConfig.from_dict(qwen3_8b_dflash_b16())
    out = cfg.to_dict()
    json.loads(json.dumps(out))
    assert out["architectures"] == ["DFlashDraftModel"]
    assert out["block_size"] == 16
    assert out["dflash_config"] == {"target_layer_ids": [1, 9, 17, 25, 33],
                                    "mask_token_id": 151669}
    assert DrafterConfig.from_dict(out) == cfg


def test_drafter_default_target_layers_from_num_target_layers():
    raw = qwen3_8b_dflash_b16()
    del raw["dflash_config"]["target_layer_ids"]
    assert DrafterConfig.from_dict(raw).target_layer_ids == [1, 9, 17, 25, 33]


def test_drafter_without_target_layer_ids_or_num_target_layers():
    raw = qwen3_8b_dflash_b16()
    del raw["dflash_config"]["target_layer_ids"]
    del raw["num_target_layers"]
    with pytest.raises(CheckpointError, match="target_layer_ids"):
        DrafterConfig.from_dict(raw)


def test_drafter_without_block_size():
    raw = qwen3_8b_dflash_b16()
    del raw["block_size"]
    with pytest.raises(CheckpointError, match="block_size"):
        DrafterConfig.from_dict(raw)


def test_drafter_without_mask_token_id():
    raw = qwen3_8b_dflash_b16()
    del raw["dflash_config"]["mask_token_id"]
    with pytest.raises(CheckpointError, match="mask_token_id"):
        DrafterConfig.from_dict(raw)


def test_drafter_without_dflash_config():
    raw = qwen3_8b_dflash_b16()
    del raw["dflash_config"]
    with pytest.raises(CheckpointError, match="mask_token_id"):
        DrafterConfig.from_dict(raw)


@pytest.mark.parametrize("block_size", [1, 0, -3])
def test_drafter_block_size_below_two(block_size):
    with pytest.raises(CheckpointError, match=rf"block_size.*{block_size}"):
        DrafterConfig.from_dict(qwen3_8b_dflash_b16() | {"block_size": block_size})


def test_drafter_block_size_two_is_accepted():
    assert DrafterConfig.from_dict(qwen3_8b_dflash_b16() | {"block_size": 2}).block_size == 2


def test_drafter_check_target_matching_pair():
    drafter = DrafterConfig.from_dict(qwen3_8b_dflash_b16())
    drafter.check_target(ModelConfig.from_dict(qwen3_8b()))  # no error


def test_drafter_check_target_hidden_size_mismatch():
    drafter = DrafterConfig.from_dict(qwen3_8b_dflash_b16())
    with pytest.raises(CheckpointError, match=r"hidden_size 4096.*2048"):
        drafter.check_target(ModelConfig.from_dict(qwen3_30b_a3b()))


def test_drafter_check_target_layer_out_of_range():
    drafter = DrafterConfig.from_dict(qwen3_8b_dflash_b16())
    shallow = ModelConfig.from_dict(qwen3_8b() | {"num_hidden_layers": 28})
    with pytest.raises(CheckpointError, match=r"\[33\].*28-layer"):
        drafter.check_target(shallow)


def test_drafter_check_target_mask_token_outside_vocab():
    drafter = DrafterConfig.from_dict(qwen3_8b_dflash_b16())
    small_vocab = ModelConfig.from_dict(qwen3_8b() | {"vocab_size": 151669})
    with pytest.raises(CheckpointError, match=r"mask_token_id 151669"):
        drafter.check_target(small_vocab)


# --- default_target_layers --------------------------------------------------------------------


def test_default_target_layers_dflash_qwen3_8b():
    assert default_target_layers(36, 5) == [1, 9, 17, 25, 33]


@pytest.mark.parametrize("layers", [4, 5, 28, 36, 37, 48, 64])
def test_default_target_layers_single_tap_is_middle(layers):
    assert default_target_layers(layers, 1) == [layers // 2]


@pytest.mark.parametrize(("layers", "n"), [(28, 5), (48, 5), (36, 3), (64, 8), (36, 2)])
def test_default_target_layers_span_one_to_l_minus_three(layers, n):
    ids = default_target_layers(layers, n)
    assert len(ids) == n
    assert ids[0] == 1 and ids[-1] == layers - 3
    assert ids == sorted(set(ids))
    gaps = [b - a for a, b in zip(ids, ids[1:])]
    assert max(gaps) - min(gaps) <= 1  # evenly spaced up to rounding


def test_default_target_layers_examples():
    assert default_target_layers(28, 5) == [1, 7, 13, 19, 25]
    assert default_target_layers(48, 5) == [1, 12, 23, 34, 45]


def test_default_target_layers_needs_a_target_depth():
    with pytest.raises(CheckpointError, match="num_target_layers"):
        default_target_layers(0, 5)


# --- read_config ------------------------------------------------------------------------------


def test_read_config(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(qwen3_8b()))
    assert read_config(tmp_path) == qwen3_8b()
    assert read_config(str(tmp_path)) == qwen3_8b()


def test_read_config_missing(tmp_path):
    with pytest.raises(CheckpointError, match="config.json"):
        read_config(tmp_path)


def test_rope_theta_under_rope_parameters_is_read():
    raw = qwen3_8b()
    raw.pop("rope_theta")
    raw["rope_parameters"] = {"rope_type": "default", "rope_theta": 5_000_000.0}
    assert ModelConfig.from_dict(raw).rope_theta == 5_000_000.0


def test_rope_scaling_other_than_yarn_is_refused_rather_than_ignored():
    with pytest.raises(CheckpointError, match="'dynamic' is not supported"):
        ModelConfig.from_dict({**qwen3_8b(), "rope_scaling": {"rope_type": "dynamic",
                                                              "factor": 4.0}})


@pytest.mark.parametrize("field", ["num_key_value_heads", "num_attention_heads"])
def test_zero_heads_are_refused(field):
    with pytest.raises(CheckpointError, match="heads"):
        ModelConfig.from_dict({**qwen3_8b(), field: 0})


def test_null_text_config_falls_back_to_the_top_level():
    assert ModelConfig.from_dict({**qwen3_8b(), "text_config": None}).hidden_size == 4096


@pytest.mark.parametrize("extra", [{"use_sliding_window": True},
                                   {"layer_types": ["full_attention", "sliding_attention"]}])
def test_sliding_window_layers_are_refused(extra):
    with pytest.raises(CheckpointError, match="sliding"):
        ModelConfig.from_dict({**qwen3_8b(), **extra})
