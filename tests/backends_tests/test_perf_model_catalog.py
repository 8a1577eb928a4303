"""Catalog facts: parameter counts, weight and KV sizes, HF config.json loading, errors.

Expected numbers are worked out by hand from the architecture facts in REFERENCE_NUMBERS.md and
notes/serving_engines.md §5, with the arithmetic in the comments.
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from backends.perf_model.catalog import CatalogError
from backends.perf_model.catalog import _catalog
from backends.perf_model.catalog import drafter_arch
from backends.perf_model.catalog import load_hardware
from backends.perf_model.catalog import load_model
from backends.perf_model.catalog import model_from_config

GIB = 2**30

# Kimi K2.6, by hand. hidden 7168, 61 layers (1 dense), vocab 163,840, 64 heads, MLA.
# MLA attention per layer:
#   q_a   7168 x 1536                       = 11,010,048
#   q_b   1536 x 64 x (128 + 64)            = 18,874,368
#   kv_a  7168 x (512 + 64)                 =  4,128,768
#   kv_b  512 x 64 x (128 + 128)            =  8,388,608
#   o     64 x 128 x 7168                   = 58,720,256
#                                     total = 101,122,048
KIMI_ATTN = 101_122_048
KIMI_EXPERT = 3 * 7168 * 2048  # gate, up, down = 44,040,192
KIMI_DENSE_MLP = 3 * 7168 * 18432  # = 396,361,728
KIMI_VOCAB_MATRIX = 163_840 * 7168  # = 1,174,405,120 (embedding or LM head)
# BF16 params that are not routed experts (embedding table excluded, LM head included):
#   61 x 101,122,048 + 396,361,728 + 60 x 44,040,192 + 1,174,405,120
#   = 6,168,444,928 + 396,361,728 + 2,642,411,520 + 1,174,405,120 = 10,381,623,296
KIMI_BF16_PARAMS = 10_381_623_296
# Resident bytes: (BF16 params + embedding) x 2 + 60 layers x 384 experts x 44,040,192 x 4.5 / 8
#   = 11,556,028,416 x 2 + 23,040 x 24,772,608 = 23,112,056,832 + 570,760,888,320
#   = 593,872,945,152 B  (~594 GB; / 8 GPUs / 2^30 = 69.14 GiB)
KIMI_WEIGHT_BYTES = 593_872_945_152


def test_kimi_bf16_non_expert_params_are_10_4_billion(kimi):
    assert kimi.attn_params_per_layer == KIMI_ATTN
    assert kimi.expert_params == kimi.shared_expert_params == KIMI_EXPERT
    assert kimi.dense_mlp_params == KIMI_DENSE_MLP
    assert kimi.dense_params == KIMI_BF16_PARAMS  # ~10.4 B


def test_kimi_weights_are_594_gb_and_69_gib_per_gpu_at_tp8(kimi):
    assert kimi.weight_bytes == pytest.approx(KIMI_WEIGHT_BYTES, rel=1e-12)
    assert kimi.weight_bytes / 1e9 == pytest.approx(594, abs=0.5)
    assert kimi.weight_bytes / 8 / GIB == pytest.approx(69.1, abs=0.05)


def test_kimi_total_params_are_about_a_trillion(kimi):
    # 10.38 B + 23,040 x 44,040,192 (= 1,014.69 B) = 1.025 T  (REFERENCE_NUMBERS: ~1.03 T)
    routed = kimi.num_moe_layers * kimi.num_experts * kimi.expert_params
    assert (kimi.dense_params + routed) / 1e12 == pytest.approx(1.025, abs=0.001)


def test_kimi_mla_kv_is_70272_bytes_a_token_over_61_layers(kimi):
    # latent 512 + rope 64 = 576 values x 2 B = 1,152 B a layer; x 61 = 70,272 B
    assert kimi.kv_bytes_per_token_layer == 1152
    assert kimi.num_layers * kimi.kv_bytes_per_token_layer == 70_272
    assert kimi.kv_heads == 0  # MLA: one latent shared by all heads


def test_qwen3_8b_has_8_2_billion_params():
    m = load_model("qwen3-8b")
    # attention: 2 x 4096 x 32 x 128 (q, o) + 2 x 4096 x 8 x 128 (k, v) = 41,943,040
    # MLP: 3 x 4096 x 12288 = 150,994,944;  36 layers x 192,937,984 = 6,945,767,424
    # untied embedding + LM head: 2 x 151,936 x 4096 = 1,244,659,712  -> 8,190,427,136
    assert m.weight_bytes / 2 == 8_190_427_136
    assert m.kv_bytes_per_token_layer == 2 * 8 * 128 * 2  # K and V, 8 heads x 128, bf16
    assert not m.is_moe and m.num_dense_layers == 36


def test_kimi_dflash_drafter_is_6_48_gib(kimi):
    d = drafter_arch(kimi, num_layers=6, num_target_layers=6, block_size=8, heads=64,
                     kv_heads=8, intermediate=18432)
    # per layer: attention 2 x 7168 x 64 x 128 + 2 x 7168 x 8 x 128 = 132,120,576
    #            MLP 3 x 7168 x 18432 = 396,361,728                 -> 528,482,304
    # 6 layers = 3,170,893,824; FC over 6 taps 6 x 7168 x 7168 = 308,281,344
    # 3,479,175,168 params x 2 B = 6,958,350,336 B = 6.4805 GiB (published: 6.48 GiB)
    assert d.params_per_layer == 528_482_304
    assert d.fc_params == 308_281_344
    assert d.weight_bytes == 6_958_350_336
    assert d.weight_bytes / GIB == pytest.approx(6.48, abs=0.005)


def test_hardware_joins_gpu_and_interconnect_facts():
    hw = load_hardware("rtx-pro-6000-server")
    assert (hw.memory_gib, hw.interconnect, hw.link_gbs) == (95.6, "pcie5", 64)


# --- HF config.json --------------------------------------------------------------------------

QWEN3_8B_CONFIG = {
    "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 4096,
    "num_hidden_layers": 36, "vocab_size": 151936, "num_attention_heads": 32,
    "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 12288,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16",
}
QWEN3_30B_A3B_CONFIG = {
    "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "hidden_size": 2048,
    "num_hidden_layers": 48, "vocab_size": 151936, "num_attention_heads": 32,
    "num_key_value_heads": 4, "head_dim": 128, "intermediate_size": 6144,
    "moe_intermediate_size": 768, "num_experts": 128, "num_experts_per_tok": 8,
    "decoder_sparse_step": 1, "mlp_only_layers": [],
}
KIMI_TEXT_CONFIG = {
    "model_type": "kimi_k2", "num_hidden_layers": 61, "first_k_dense_replace": 1,
    "hidden_size": 7168, "vocab_size": 163840, "num_attention_heads": 64, "q_lora_rank": 1536,
    "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
    "intermediate_size": 18432, "moe_intermediate_size": 2048, "n_routed_experts": 384,
    "num_experts_per_tok": 8, "n_shared_experts": 1, "expert_weight_bits": 4.5,
}


@pytest.fixture
def write_config(tmp_path):
    def write(config: dict, folder: str = "model") -> str:
        path = tmp_path / folder
        path.mkdir()
        (path / "config.json").write_text(json.dumps(config))
        return str(path)

    return write


def test_qwen3_dense_config_json_matches_the_catalog_entry(write_config):
    folder = write_config(QWEN3_8B_CONFIG, "Qwen3-8B")
    from_file = load_model(folder)
    assert from_file.name == "Qwen3-8B"
    assert from_file == replace(load_model("qwen3-8b"), name="Qwen3-8B")
    assert load_model(folder + "/config.json") == from_file  # the file itself works too


def test_qwen3_moe_config_json_counts_experts(write_config):
    m = load_model(write_config(QWEN3_30B_A3B_CONFIG))
    assert (m.num_experts, m.top_k, m.num_dense_layers, m.num_moe_layers) == (128, 8, 0, 48)
    assert m.expert_params == 3 * 2048 * 768  # 4,718,592
    # attention 48 x (2 x 2048 x 32 x 128 + 2 x 2048 x 4 x 128) = 48 x 18,874,368 = 905,969,664
    # experts 48 x 128 x 4,718,592 = 28,991,029,248; embedding + LM head 2 x 151,936 x 2048
    # = 622,329,856  -> 30,519,328,768 params (~30.5 B, the model's name says 30B)
    assert m.weight_bytes / 2 == 30_519_328_768
    assert m.kv_heads == 4


def test_kimi_style_nested_text_config_is_read(write_config, kimi):
    config = {"architectures": ["KimiK25ForConditionalGeneration"],
              "vision_config": {"hidden_size": 1152}, "text_config": KIMI_TEXT_CONFIG}
    m = load_model(write_config(config, "Kimi-K2.6"))
    assert m == replace(kimi, name="Kimi-K2.6")


def test_real_kimi_config_reads_int4_experts_from_quantization_config(write_config, kimi):
    text = {k: v for k, v in KIMI_TEXT_CONFIG.items() if k != "expert_weight_bits"}
    text["quantization_config"] = {
        "quant_method": "compressed-tensors", "format": "pack-quantized",
        "config_groups": {"group_0": {"targets": ["Linear"],
                                      "weights": {"num_bits": 4, "group_size": 32}}}}
    m = load_model(write_config({"text_config": text}))
    assert m.expert_weight_bits == pytest.approx(4.5)


def test_config_missing_a_field_names_it(write_config):
    config = {k: v for k, v in QWEN3_8B_CONFIG.items() if k != "vocab_size"}
    with pytest.raises(CatalogError, match="vocab_size"):
        load_model(write_config(config))


def test_mla_config_missing_a_field_names_it():
    config = {k: v for k, v in KIMI_TEXT_CONFIG.items() if k != "qk_rope_head_dim"}
    with pytest.raises(CatalogError, match="qk_rope_head_dim"):
        model_from_config("kimi", config)


def test_invalid_json_is_a_catalog_error(tmp_path):
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(CatalogError, match="not valid JSON"):
        load_model(str(tmp_path))


def test_unknown_model_name_lists_the_catalog():
    with pytest.raises(CatalogError) as err:
        load_model("llama-9000")
    assert all(name in str(err.value) for name in ("kimi-k2.6", "qwen3-8b", "qwen3-30b-a3b"))


def test_unknown_gpu_lists_the_known_ones():
    with pytest.raises(CatalogError) as err:
        load_hardware("rtx-4090")
    assert "h200-sxm" in str(err.value) and "rtx-pro-6000-server" in str(err.value)


def test_tied_embeddings_are_stored_once(write_config):
    untied = load_model(write_config(QWEN3_8B_CONFIG, "untied"))
    tied = load_model(write_config({**QWEN3_8B_CONFIG, "tie_word_embeddings": True}, "tied"))
    # One 151,936 x 4,096 bf16 table fewer: 1,244,659,712 bytes.
    assert untied.weight_bytes - tied.weight_bytes == 151936 * 4096 * 2


@pytest.mark.parametrize("field, value", [("hidden_size", 10**9), ("num_hidden_layers", 10**6),
                                          ("vocab_size", -1), ("hidden_size", 4096.5)])
def test_a_config_size_no_real_model_has_is_one_line(field, value):
    config = {**_catalog("models.yaml")["models"]["qwen3-8b"], field: value}
    with pytest.raises(CatalogError, match=f"{field} must be an integer in 0..") as err:
        model_from_config("odd", config)
    assert "\n" not in str(err.value)
