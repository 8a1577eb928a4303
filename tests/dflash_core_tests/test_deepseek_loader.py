"""Loading DeepSeek-V3 / Kimi checkpoints: the K2.6 wrapper's prefixed text weights (vision
tower skipped), DeepSeek-V3's extra MTP layer skipped, BF16 loads keep the router in fp32, and
the weights stream in one tensor at a time into the model's own storage."""

from __future__ import annotations

import json
import weakref

import torch
from deepseek_helpers import make_deepseek
from safetensors.torch import save_file

from dflash_core.models import lazy_weights
from dflash_core.models.layers import fuse_projections
from dflash_core.models.loader import load_target, save_model
from dflash_core.models.step import Step


def _state(target) -> dict[str, torch.Tensor]:
    return {k: v.detach().contiguous() for k, v in target.state_dict().items()}


def _logits(target, ids=((5, 3, 9, 1, 30, 2),)):
    """The target's logits with its projections fused, as a loaded target's are: a round trip
    must then be bit-exact (a fused GEMM may round differently from three)."""
    fuse_projections(target)
    ids = torch.tensor(ids)
    step = Step.causal(torch.zeros(len(ids), dtype=torch.long), ids.shape[1], 0)
    with torch.no_grad():
        return target.logits(target(ids, step, target.allocate_cache(len(ids), ids.shape[1]))[0])


def _write_sharded(state: dict[str, torch.Tensor], folder, shards: int = 3) -> None:
    keys = sorted(state)
    weight_map = {k: f"model-{i % shards + 1:05d}-of-{shards:05d}.safetensors"
                  for i, k in enumerate(keys)}
    for name in set(weight_map.values()):
        save_file({k: state[k] for k in keys if weight_map[k] == name}, str(folder / name))
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))


def test_kimi_k26_wrapper_loads_the_language_model_and_skips_the_vision_tower(tmp_path):
    target = make_deepseek(int4=True)
    text = target.config.to_dict()
    quant = text.pop("quantization_config")
    wrapper = {"architectures": ["KimiK25ForConditionalGeneration"], "model_type": "kimi_k25",
               "text_config": text | {"model_type": "kimi_k2"}, "quantization_config": quant,
               "vision_config": {"hidden_size": 8}}
    (tmp_path / "config.json").write_text(json.dumps(wrapper))
    state = {f"language_model.{k}": v for k, v in _state(target).items()}
    state["vision_tower.encoder.blocks.0.wqkv.weight"] = torch.zeros(24, 8)
    state["mm_projector.proj.0.weight"] = torch.zeros(4, 8)
    _write_sharded(state, tmp_path)
    loaded = load_target(tmp_path)
    assert loaded.config.weight_prefix == "language_model."
    torch.testing.assert_close(_logits(loaded), _logits(target), atol=0, rtol=0)


def test_deepseek_v3_multi_token_prediction_layer_is_skipped(tmp_path):
    target = make_deepseek()
    save_model(target, tmp_path)
    state = _state(target)
    state["model.layers.3.eh_proj.weight"] = torch.zeros(36, 72)  # the MTP module's layer
    state["model.layers.3.self_attn.kv_b_proj.weight"] = torch.zeros(3, 3)
    save_file(state, str(tmp_path / "model.safetensors"))
    torch.testing.assert_close(_logits(load_target(tmp_path)), _logits(target), atol=0, rtol=0)


def test_bfloat16_load_keeps_the_router_in_fp32(tmp_path):
    target = make_deepseek()
    save_model(target, tmp_path)
    loaded = load_target(tmp_path, dtype=torch.bfloat16)
    gate = loaded.model.layers[1].mlp.gate
    assert gate.e_score_correction_bias.dtype == torch.float32 == gate.weight.dtype
    torch.testing.assert_close(gate.e_score_correction_bias,
                               target.model.layers[1].mlp.gate.e_score_correction_bias)
    assert loaded.lm_head.weight.dtype == torch.bfloat16
    assert loaded.model.layers[1].mlp.experts.gate_up_proj.dtype == torch.bfloat16


def test_weights_stream_in_one_tensor_at_a_time(tmp_path, monkeypatch):
    """No second copy: each checkpoint tensor is dropped before the next is read."""
    target = make_deepseek(int4=True)
    save_model(target, tmp_path)
    alive: list[weakref.ref] = []
    read = lazy_weights._read

    def recording(shard, path, key):  # tensors hold no cycles: refcounting frees them at once
        assert all(ref() is None for ref in alive), "an earlier checkpoint tensor is still held"
        tensor = read(shard, path, key)
        alive.append(weakref.ref(tensor))
        return tensor

    monkeypatch.setattr(lazy_weights, "_read", recording)
    loaded = load_target(tmp_path)
    assert len(alive) == len(_state(target))
    torch.testing.assert_close(_logits(loaded), _logits(target), atol=0, rtol=0)
