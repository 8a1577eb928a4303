"""INT4 routed experts in the compressed-tensors pack-quantized layout: the engine's
dequantisation equals one written here from the format's description, the INT4 experts compute
what BF16 experts holding those weights compute, and a checkpoint in that layout round-trips."""

from __future__ import annotations

import json

import torch
from deepseek_helpers import make_deepseek
from safetensors import safe_open

from dflash_core.models.deepseek_moe import DeepseekMoE
from dflash_core.models.int4 import Int4Experts, dequantize, pack, quantize
from dflash_core.models.layers import Experts, fuse_projections, mix_experts
from dflash_core.models.loader import load_target, save_model
from dflash_core.models.step import Step


def reference_dequantize(packed: torch.Tensor, scale: torch.Tensor, shape,
                         group: int = 32) -> torch.Tensor:
    """From the format's description, one value at a time: word j of row o holds inputs
    8j .. 8j + 7, input 8j + n in bits 4n .. 4n + 3, stored as value + 8; input i belongs to
    scale group i // group_size."""
    rows, cols = shape
    out = torch.zeros(rows, cols, dtype=torch.float64)
    words = packed.tolist()
    for o in range(rows):
        for i in range(cols):
            word = words[o][i // 8] & 0xFFFFFFFF  # the int32's bits, unsigned
            nibble = (word >> (4 * (i % 8))) & 0xF
            out[o, i] = (nibble - 8) * float(scale[o, i // group])
    return out


def _random_experts(seed: int = 0) -> Int4Experts:
    torch.manual_seed(seed)
    experts = Int4Experts(num_experts=3, hidden=40, intermediate=12, group=32)  # 40: 2 groups,
    # the last one partial
    for name in ("gate_up", "down"):
        packed = getattr(experts, f"{name}_packed")
        packed.copy_(torch.randint(-2**31, 2**31 - 1, packed.shape, dtype=torch.int64))
        getattr(experts, f"{name}_scale").uniform_(0.01, 0.1)
    return experts


def test_dequantised_experts_equal_the_reference_dequantisation():
    experts = _random_experts()
    gate_up, down = experts.dequantized(torch.float32)
    state = experts.state_dict()
    for e in range(3):
        for name, got in (("gate_proj", gate_up[e, :12]), ("up_proj", gate_up[e, 12:]),
                          ("down_proj", down[e])):
            shape = tuple(state[f"{e}.{name}.weight_shape"].tolist())
            want = reference_dequantize(state[f"{e}.{name}.weight_packed"],
                                        state[f"{e}.{name}.weight_scale"], shape)
            torch.testing.assert_close(got.double(), want, atol=1e-7, rtol=1e-6)


def test_pack_unpack_round_trips_every_value_including_the_sign_bit_word():
    values = torch.arange(-8, 8).repeat(3, 2)[:, :29]  # 29 inputs: a padded last word
    packed = pack(values)
    assert packed.dtype == torch.int32 and packed.shape == (3, 4)
    assert (packed < 0).any()  # a 7 in the top nibble sets the int32 sign bit
    ones = torch.ones(3, 1)  # one group of 32 covering the 29 inputs
    assert torch.equal(dequantize(packed, ones, 29, 32, torch.float32).long(), values)


def test_quantize_error_is_within_half_a_step():
    weight = torch.randn(6, 70, generator=torch.Generator().manual_seed(2))
    packed, scale = quantize(weight, 32)
    assert scale.shape == (6, 3)
    back = reference_dequantize(packed, scale, (6, 70)).float()
    step = scale.repeat_interleave(32, dim=1)[:, :70]
    assert ((back - weight).abs() <= step / 2 + 1e-6).all()


def test_int4_experts_compute_what_bf16_experts_with_those_weights_compute():
    experts = _random_experts(seed=3)
    dense = Experts(3, 40, 12)
    gate_up, down = experts.dequantized(torch.float32)
    with torch.no_grad():
        dense.gate_up_proj.copy_(gate_up)
        dense.down_proj.copy_(down)
    gen = torch.Generator().manual_seed(4)
    tokens = torch.randn(9, 40, generator=gen)
    ids = torch.randint(0, 3, (9, 2), generator=gen)
    weights = torch.rand(9, 2, generator=gen)
    torch.testing.assert_close(experts(tokens, weights, ids), dense(tokens, weights, ids))


def test_int4_checkpoint_round_trips_in_the_compressed_tensors_layout(tmp_path):
    target = make_deepseek(int4=True)
    save_model(target, tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["quantization_config"]["format"] == "pack-quantized"
    assert config["quantization_config"]["config_groups"]["group_0"]["weights"]["group_size"] == 32
    with safe_open(str(tmp_path / "model.safetensors"), "pt") as f:
        keys = set(f.keys())
        packed = f.get_tensor("model.layers.1.mlp.experts.5.down_proj.weight_packed")
        shape = f.get_tensor("model.layers.1.mlp.experts.5.down_proj.weight_shape")
    assert packed.dtype == torch.int32 and packed.shape == (36, 2)  # in = 16 -> 2 words
    assert shape.tolist() == [36, 16]
    assert "model.layers.2.mlp.experts.0.gate_proj.weight_scale" in keys
    assert not any(k.endswith("experts.0.gate_proj.weight") for k in keys)
    assert "model.layers.1.mlp.shared_experts.up_proj.weight" in keys  # BF16, not quantised
    loaded = load_target(tmp_path)
    assert isinstance(loaded.model.layers[1].mlp, DeepseekMoE)
    assert isinstance(loaded.model.layers[1].mlp.experts, Int4Experts)
    ids = torch.tensor([[5, 3, 9, 1, 30, 2]])
    step = Step.causal(torch.zeros(1, dtype=torch.long), 6, 0)
    fuse_projections(target)  # as the loaded one's are: then the round trip is bit-exact
    with torch.no_grad():
        want = target.logits(target(ids, step, target.allocate_cache(1, 6))[0])
        got = loaded.logits(loaded(ids, step, loaded.allocate_cache(1, 6))[0])
    torch.testing.assert_close(got, want, atol=0, rtol=0)


def test_few_routed_pairs_read_only_their_experts_and_match_the_all_experts_path():
    experts = _random_experts(seed=5)
    gen = torch.Generator().manual_seed(6)
    tokens = torch.randn(1, 40, generator=gen)  # one token, two slots: 2 pairs < 3 experts
    ids, weights = torch.tensor([[2, 0]]), torch.rand(1, 2, generator=gen)
    gate_up, down = experts.dequantized(torch.float32)
    want = mix_experts(tokens, weights, ids, gate_up, down)
    torch.testing.assert_close(experts(tokens, weights, ids), want)
    with torch.no_grad():  # poison the expert no pair uses: any computation with it gives NaN
        experts.gate_up_scale[1].fill_(float("nan"))
        experts.down_scale[1].fill_(float("nan"))
    torch.testing.assert_close(experts(tokens, weights, ids), want)
