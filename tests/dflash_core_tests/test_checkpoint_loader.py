"""Checkpoint loading in the public layouts: HF Qwen3 targets and DFlash drafters (safetensors)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from core_helpers import BLOCK, MASK_TOKEN, VOCAB, make_drafter, make_target, target_config
from safetensors.torch import load_file, save_file

from dflash_core.models.config import CheckpointError, ModelConfig
from dflash_core.models.loader import load_drafter, load_target, read_weights, save_model
from dflash_core.models.step import Step

TARGETS = {
    "dense": dict(moe=False),
    "moe": dict(moe=True),
    "tied": dict(moe=False, tie_word_embeddings=True),
    "tied-moe": dict(moe=True, tie_word_embeddings=True),
}
IDS = torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5]])


# --- helpers ----------------------------------------------------------------------------------


def _randomise_norms(model: torch.nn.Module, seed: int) -> torch.nn.Module:
    """RMSNorm weights start at 1: make them distinct so a skipped norm would be noticed."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 1:
                p.add_(0.1 * torch.randn(p.shape, generator=gen))
    return model


def _target(kind: str, seed: int = 0):
    return _randomise_norms(make_target(seed=seed, **TARGETS[kind]), seed + 100)


def _drafter(seed: int = 1):
    return _randomise_norms(make_drafter(seed=seed), seed + 100)


def public_target_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Key names and shapes of an HF Qwen3 / Qwen3-MoE checkpoint, written out independently."""
    h = cfg.hidden_size
    out = {"model.embed_tokens.weight": (cfg.vocab_size, h), "model.norm.weight": (h,)}
    if not cfg.tie_word_embeddings:
        out["lm_head.weight"] = (cfg.vocab_size, h)
    for i in range(cfg.num_hidden_layers):
        out.update(_layer_shapes(f"model.layers.{i}.", cfg))
        p = f"model.layers.{i}.mlp."
        if cfg.is_moe_layer(i):
            out[p + "gate.weight"] = (cfg.num_experts, h)
            for e in range(cfg.num_experts):
                out.update(_mlp_shapes(f"{p}experts.{e}.", h, cfg.moe_intermediate_size))
        else:
            out.update(_mlp_shapes(p, h, cfg.intermediate_size))
    return out


def public_drafter_shapes(model) -> dict[str, tuple[int, ...]]:
    cfg = model.config
    lc = cfg.layers
    h = lc.hidden_size
    out = {
        "fc.weight": (h, len(cfg.target_layer_ids) * h),
        "hidden_norm.weight": (h,),
        "norm.weight": (h,),
    }
    for i in range(lc.num_hidden_layers):
        out.update(_layer_shapes(f"layers.{i}.", lc))
        out.update(_mlp_shapes(f"layers.{i}.mlp.", h, lc.intermediate_size))
    return out


def _layer_shapes(p: str, cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    h, hd = cfg.hidden_size, cfg.head_dim
    q, kv = cfg.num_attention_heads * hd, cfg.num_key_value_heads * hd
    return {
        p + "input_layernorm.weight": (h,),
        p + "post_attention_layernorm.weight": (h,),
        p + "self_attn.q_proj.weight": (q, h),
        p + "self_attn.k_proj.weight": (kv, h),
        p + "self_attn.v_proj.weight": (kv, h),
        p + "self_attn.o_proj.weight": (h, q),
        p + "self_attn.q_norm.weight": (hd,),
        p + "self_attn.k_norm.weight": (hd,),
    }


def _mlp_shapes(p: str, h: int, inter: int) -> dict[str, tuple[int, ...]]:
    return {p + "gate_proj.weight": (inter, h), p + "up_proj.weight": (inter, h),
            p + "down_proj.weight": (h, inter)}


def target_forward(target, ids: torch.Tensor = IDS, taps=(0, 2)):
    """Prefill `ids` as the engine does; returns (normed hidden, tapped features, logits)."""
    cache = target.allocate_cache(ids.shape[0], 32)
    step = Step.causal(torch.zeros(ids.shape[0], dtype=torch.long), ids.shape[1], 0)
    with torch.no_grad():
        hidden, features = target(ids, step, cache, list(taps))
        return hidden, features, target.logits(hidden)


def drafter_forward(drafter, context: int = 7):
    """Write `context` positions of fused target features, then run one non-causal block."""
    gen = torch.Generator().manual_seed(5)
    h = drafter.config.layers.hidden_size
    n_taps = len(drafter.config.target_layer_ids)
    features = torch.randn(1, context, n_taps * h, generator=gen)
    block = torch.randn(1, BLOCK, h, generator=gen)
    cache = drafter.allocate_cache(1, 32)
    step = Step.causal(torch.tensor([context]), BLOCK, context)
    step.mask = torch.ones_like(step.mask)
    with torch.no_grad():
        drafter.write_context(features, torch.arange(context)[None], cache)
        return drafter(block, step, cache)


def assert_same_state(loaded, original, dtype=torch.float32):
    got, want = loaded.state_dict(), original.state_dict()
    assert got.keys() == want.keys()
    for key, value in want.items():
        assert got[key].dtype == dtype, key
        assert torch.equal(got[key], value.to(dtype)), key


def _edit_weights(directory: Path, edit) -> None:
    path = directory / "model.safetensors"
    weights = load_file(str(path))
    edit(weights)
    save_file(weights, str(path))


def _edit_config(directory: Path, edit) -> None:
    path = directory / "config.json"
    raw = json.loads(path.read_text())
    edit(raw)
    path.write_text(json.dumps(raw))


@pytest.fixture
def target_dir(tmp_path):
    save_model(_target("dense"), tmp_path)
    return tmp_path


@pytest.fixture
def drafter_dir(tmp_path):
    save_model(_drafter(), tmp_path)
    return tmp_path


# --- round trips ------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", TARGETS)
def test_target_round_trip(tmp_path, kind):
    original = _target(kind)
    save_model(original, tmp_path)
    loaded = load_target(tmp_path)

    assert loaded.config == original.config
    assert not loaded.training
    assert_same_state(loaded, original)
    for got, want in zip(target_forward(loaded), target_forward(original)):
        assert got.shape == want.shape
        assert torch.equal(got, want)
    if original.config.tie_word_embeddings:
        assert loaded.lm_head.weight is loaded.model.embed_tokens.weight


@pytest.mark.parametrize("kind", TARGETS)
def test_target_file_uses_public_names(tmp_path, kind):
    original = _target(kind)
    save_model(original, tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json", "model.safetensors"]
    saved = load_file(str(tmp_path / "model.safetensors"))
    assert {k: tuple(v.shape) for k, v in saved.items()} == public_target_shapes(original.config)
    assert ("lm_head.weight" in saved) == (not original.config.tie_word_embeddings)
    raw = json.loads((tmp_path / "config.json").read_text())
    assert raw["model_type"] == ("qwen3_moe" if kind.endswith("moe") else "qwen3")
    assert raw["tie_word_embeddings"] == kind.startswith("tied")


def test_moe_file_has_router_and_every_expert(tmp_path):
    original = _target("moe")
    save_model(original, tmp_path)
    saved = load_file(str(tmp_path / "model.safetensors"))
    cfg = original.config
    assert cfg.mlp_only_layers == [0]
    assert "model.layers.0.mlp.gate_proj.weight" in saved  # layer 0 stays dense
    assert "model.layers.0.mlp.gate.weight" not in saved
    for e in range(cfg.num_experts):
        assert f"model.layers.3.mlp.experts.{e}.down_proj.weight" in saved
    assert f"model.layers.3.mlp.experts.{cfg.num_experts}.down_proj.weight" not in saved
    key = "model.layers.2.mlp.experts.4.up_proj.weight"
    assert torch.equal(saved[key], original.state_dict()[key])


def test_target_load_in_bfloat16(tmp_path):
    original = _target("tied")
    save_model(original, tmp_path)
    loaded = load_target(tmp_path, dtype=torch.bfloat16)
    assert_same_state(loaded, original, dtype=torch.bfloat16)
    assert loaded.lm_head.weight is loaded.model.embed_tokens.weight
    hidden, _, logits = target_forward(loaded)
    assert hidden.dtype == torch.bfloat16 and logits.dtype == torch.float32


def test_bfloat16_checkpoint_loads_into_float32(tmp_path):
    original = _target("dense").to(torch.bfloat16)
    save_model(original, tmp_path)
    assert load_file(str(tmp_path / "model.safetensors"))["lm_head.weight"].dtype == torch.bfloat16
    loaded = load_target(tmp_path)
    assert_same_state(loaded, original.float())


def test_drafter_round_trip(tmp_path):
    original = _drafter()
    save_model(original, tmp_path)
    loaded = load_drafter(tmp_path, target=target_config())

    assert loaded.config == original.config
    assert not loaded.training
    assert_same_state(loaded, original)
    got, want = drafter_forward(loaded), drafter_forward(original)
    assert got.shape == (1, BLOCK, 32)
    assert torch.equal(got, want)


def test_drafter_file_uses_public_names(tmp_path):
    original = _drafter()
    save_model(original, tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json", "model.safetensors"]
    saved = load_file(str(tmp_path / "model.safetensors"))
    assert {k: tuple(v.shape) for k, v in saved.items()} == public_drafter_shapes(original)
    assert saved["fc.weight"].shape == (32, 2 * 32)
    assert not [k for k in saved if k.startswith(("model.", "embed", "lm_head"))]
    assert not [k for k in saved if "embed_tokens" in k or "lm_head" in k]

    raw = json.loads((tmp_path / "config.json").read_text())
    assert raw["block_size"] == BLOCK
    assert raw["dflash_config"] == {"target_layer_ids": [0, 2], "mask_token_id": MASK_TOKEN}
    assert raw["architectures"] == ["DFlashDraftModel"]


def test_drafter_default_target_layers_when_config_lists_none(drafter_dir):
    def edit(raw):
        del raw["dflash_config"]["target_layer_ids"]
        raw["num_target_layers"] = 7  # two taps evenly over 1..4

    _edit_config(drafter_dir, edit)
    assert load_drafter(drafter_dir).config.target_layer_ids == [1, 4]


def test_save_model_creates_nested_directory(tmp_path):
    out = tmp_path / "a" / "b"
    save_model(_drafter(), out)
    assert (out / "config.json").is_file() and (out / "model.safetensors").is_file()


# --- sharded index ----------------------------------------------------------------------------


def write_sharded(model, directory: Path, shards: int, dtype=None) -> dict[str, str]:
    """An HF-style sharded checkpoint by hand: shard files + model.safetensors.index.json."""
    directory.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}
    if model.config.tie_word_embeddings:
        del state["lm_head.weight"]
    if dtype is not None:
        state = {k: v.to(dtype) for k, v in state.items()}
    names = [f"model-{i + 1:05d}-of-{shards:05d}.safetensors" for i in range(shards)]
    weight_map = {key: names[i * shards // len(state)] for i, key in enumerate(state)}
    for name in names:
        save_file({k: v for k, v in state.items() if weight_map[k] == name}, str(directory / name))
    total = sum(v.numel() * v.element_size() for v in state.values())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (directory / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    (directory / "config.json").write_text(json.dumps(model.config.to_dict()))
    return weight_map


@pytest.mark.parametrize(("kind", "shards"), [("dense", 2), ("moe", 3), ("tied", 3)])
def test_sharded_target(tmp_path, kind, shards):
    original = _target(kind)
    weight_map = write_sharded(original, tmp_path, shards)
    assert len(set(weight_map.values())) == shards
    assert not (tmp_path / "model.safetensors").exists()

    assert read_weights(tmp_path).keys() == weight_map.keys()
    loaded = load_target(tmp_path)
    assert_same_state(loaded, original)
    for got, want in zip(target_forward(loaded), target_forward(original)):
        assert torch.equal(got, want)


def test_sharded_bfloat16_checkpoint(tmp_path):
    original = _target("moe")
    write_sharded(original, tmp_path, 3, dtype=torch.bfloat16)
    assert_same_state(load_target(tmp_path), original.to(torch.bfloat16).float())


def test_sharded_index_takes_the_shards_not_a_stale_single_file(tmp_path):
    write_sharded(_target("dense", seed=0), tmp_path, 2)
    save_file({"junk": torch.zeros(1)}, str(tmp_path / "model.safetensors"))
    assert_same_state(load_target(tmp_path), _target("dense", seed=0))


def test_sharded_missing_shard_is_named(tmp_path):
    weight_map = write_sharded(_target("dense"), tmp_path, 3)
    gone = sorted(set(weight_map.values()))[1]
    (tmp_path / gone).unlink()
    with pytest.raises(CheckpointError, match=gone):
        load_target(tmp_path)


def test_sharded_key_absent_from_every_shard_is_named(tmp_path):
    weight_map = write_sharded(_target("dense"), tmp_path, 2)
    key = "model.layers.1.post_attention_layernorm.weight"
    shard = tmp_path / weight_map[key]
    weights = load_file(str(shard))
    del weights[key]
    save_file(weights, str(shard))
    with pytest.raises(CheckpointError, match=key):
        load_target(tmp_path)


def test_sharded_corrupt_shard_is_named(tmp_path):
    weight_map = write_sharded(_target("dense"), tmp_path, 2)
    bad = sorted(set(weight_map.values()))[0]
    (tmp_path / bad).write_bytes(b"\x00" * 7)
    with pytest.raises(CheckpointError, match=bad):
        load_target(tmp_path)


# --- errors -----------------------------------------------------------------------------------


@pytest.mark.parametrize("which", ["target", "drafter"])
def test_missing_config_json(tmp_path, which):
    save_model(_target("dense") if which == "target" else _drafter(), tmp_path)
    (tmp_path / "config.json").unlink()
    load = load_target if which == "target" else load_drafter
    with pytest.raises(CheckpointError, match="config.json"):
        load(tmp_path)


def test_missing_directory(tmp_path):
    with pytest.raises(CheckpointError, match="config.json"):
        load_target(tmp_path / "nowhere")


@pytest.mark.parametrize("which", ["target", "drafter"])
def test_no_weights_file(tmp_path, which):
    save_model(_target("dense") if which == "target" else _drafter(), tmp_path)
    (tmp_path / "model.safetensors").unlink()
    load = load_target if which == "target" else load_drafter
    with pytest.raises(CheckpointError) as info:
        load(tmp_path)
    assert "model.safetensors" in str(info.value)
    assert "model.safetensors.index.json" in str(info.value)


def test_read_weights_without_weights(tmp_path):
    with pytest.raises(CheckpointError, match="model.safetensors"):
        read_weights(tmp_path)


@pytest.mark.parametrize("content", [b"", b"not a safetensors file at all",
                                     b"\x10\x00\x00\x00\x00\x00\x00\x00{\"a\": 1}"])
def test_corrupt_safetensors(target_dir, content):
    (target_dir / "model.safetensors").write_bytes(content)
    with pytest.raises(CheckpointError, match=r"model\.safetensors.*safetensors"):
        load_target(target_dir)


def test_truncated_safetensors(drafter_dir):
    path = drafter_dir / "model.safetensors"
    path.write_bytes(path.read_bytes()[:-100])
    with pytest.raises(CheckpointError, match=r"model\.safetensors"):
        load_drafter(drafter_dir)


@pytest.mark.parametrize("key", ["model.layers.1.self_attn.k_norm.weight", "lm_head.weight",
                                 "model.embed_tokens.weight", "model.norm.weight"])
def test_target_missing_key_is_named(target_dir, key):
    _edit_weights(target_dir, lambda w: w.pop(key))
    with pytest.raises(CheckpointError, match=key):
        load_target(target_dir)


def test_moe_missing_expert_is_named(tmp_path):
    save_model(_target("moe"), tmp_path)
    key = "model.layers.2.mlp.experts.5.gate_proj.weight"
    _edit_weights(tmp_path, lambda w: w.pop(key))
    with pytest.raises(CheckpointError, match=key):
        load_target(tmp_path)


@pytest.mark.parametrize("key", ["fc.weight", "hidden_norm.weight", "layers.1.mlp.up_proj.weight"])
def test_drafter_missing_key_is_named(drafter_dir, key):
    _edit_weights(drafter_dir, lambda w: w.pop(key))
    with pytest.raises(CheckpointError, match=key):
        load_drafter(drafter_dir)


@pytest.mark.parametrize("key", ["model.layers.4.mlp.gate_proj.weight", "model.extra.bias",
                                 "model.layers.0.self_attn.q_proj.bias"])
def test_target_unexpected_key_is_named(target_dir, key):
    _edit_weights(target_dir, lambda w: w.update({key: torch.zeros(3)}))
    with pytest.raises(CheckpointError, match=key):
        load_target(target_dir)


@pytest.mark.parametrize("key", ["embed_tokens.weight", "lm_head.weight",
                                 "layers.2.mlp.up_proj.weight"])
def test_drafter_unexpected_key_is_named(drafter_dir, key):
    _edit_weights(drafter_dir, lambda w: w.update({key: torch.zeros(VOCAB, 32)}))
    with pytest.raises(CheckpointError, match=key):
        load_drafter(drafter_dir)


def test_drafter_with_model_prefix_is_refused(drafter_dir):
    """A drafter saved with HF's `model.` prefix does not match the public DFlash layout."""
    _edit_weights(drafter_dir, lambda w: w.update({f"model.{k}": w.pop(k) for k in list(w)}))
    with pytest.raises(CheckpointError, match="fc.weight"):
        load_drafter(drafter_dir)


def test_target_wrong_shape_names_key_and_both_shapes(target_dir):
    key = "model.layers.2.self_attn.k_proj.weight"
    _edit_weights(target_dir, lambda w: w.update({key: torch.zeros(8, 32)}))
    with pytest.raises(CheckpointError) as info:
        load_target(target_dir)
    message = str(info.value)
    assert key in message
    assert "(8, 32)" in message and "(16, 32)" in message


def test_target_wrong_vocab_shape(target_dir):
    _edit_weights(target_dir, lambda w: w.update({"lm_head.weight": torch.zeros(VOCAB + 1, 32)}))
    with pytest.raises(CheckpointError) as info:
        load_target(target_dir)
    message = str(info.value)
    assert "lm_head.weight" in message
    assert f"({VOCAB + 1}, 32)" in message and f"({VOCAB}, 32)" in message


def test_drafter_fc_shape_for_another_tap_count(drafter_dir):
    _edit_weights(drafter_dir, lambda w: w.update({"fc.weight": torch.zeros(32, 3 * 32)}))
    with pytest.raises(CheckpointError) as info:
        load_drafter(drafter_dir)
    message = str(info.value)
    assert "fc.weight" in message and "(32, 96)" in message and "(32, 64)" in message


def test_drafter_hidden_size_differs_from_target(drafter_dir):
    with pytest.raises(CheckpointError, match=r"hidden_size 32.*hidden_size 64"):
        load_drafter(drafter_dir, target=target_config(hidden_size=64))


def test_drafter_target_layer_ids_out_of_range(drafter_dir):
    with pytest.raises(CheckpointError, match=r"target_layer_ids \[2\].*2-layer"):
        load_drafter(drafter_dir, target=target_config(num_hidden_layers=2))


def test_drafter_negative_target_layer_id(drafter_dir):
    _edit_config(drafter_dir, lambda raw: raw["dflash_config"].update(target_layer_ids=[-1, 2]))
    with pytest.raises(CheckpointError, match=r"target_layer_ids \[-1\]"):
        load_drafter(drafter_dir, target=target_config())


def test_drafter_mask_token_outside_target_vocab(drafter_dir):
    with pytest.raises(CheckpointError, match=rf"mask_token_id {MASK_TOKEN}"):
        load_drafter(drafter_dir, target=target_config(vocab_size=MASK_TOKEN))


def test_drafter_with_another_vocabulary_is_refused(drafter_dir):
    """Its logits come through the target's LM head: another vocabulary would draft nonsense."""
    with pytest.raises(CheckpointError, match=rf"drafter vocab_size {VOCAB} != target "
                                              rf"vocab_size {VOCAB + 16}"):
        load_drafter(drafter_dir, target=target_config(vocab_size=VOCAB + 16))


def test_drafter_target_check_is_skipped_without_target(drafter_dir):
    """With no target given only the drafter's own checkpoint is validated."""
    assert load_drafter(drafter_dir).config.mask_token_id == MASK_TOKEN


def test_drafter_config_without_block_size(drafter_dir):
    _edit_config(drafter_dir, lambda raw: raw.pop("block_size"))
    with pytest.raises(CheckpointError, match="block_size"):
        load_drafter(drafter_dir)


def test_drafter_config_without_mask_token_id(drafter_dir):
    _edit_config(drafter_dir, lambda raw: raw["dflash_config"].pop("mask_token_id"))
    with pytest.raises(CheckpointError, match="mask_token_id"):
        load_drafter(drafter_dir)


def test_drafter_block_size_below_two(drafter_dir):
    _edit_config(drafter_dir, lambda raw: raw.update(block_size=1))
    with pytest.raises(CheckpointError, match=r"block_size must be >= 2, got 1"):
        load_drafter(drafter_dir)


def test_target_config_missing_field_is_named(target_dir):
    _edit_config(target_dir, lambda raw: raw.pop("num_key_value_heads"))
    with pytest.raises(CheckpointError, match="num_key_value_heads"):
        load_target(target_dir)


def test_target_config_smaller_than_weights(target_dir):
    """config.json says 3 layers but the file holds 4: layer 3's keys are unexpected."""
    _edit_config(target_dir, lambda raw: raw.update(num_hidden_layers=3))
    with pytest.raises(CheckpointError, match=r"model\.layers\.3\."):
        load_target(target_dir)


def test_corrupt_config_json(target_dir):
    (target_dir / "config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="config.json"):
        load_target(target_dir)


def test_index_without_weight_map(tmp_path):
    write_sharded(_target("dense"), tmp_path, 2)
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}}))
    with pytest.raises(CheckpointError, match="weight_map"):
        load_target(tmp_path)


def test_tied_checkpoint_with_a_copy_of_the_head_loads(tmp_path):
    target = _target("tied")
    save_model(target, tmp_path)
    weights = load_file(str(tmp_path / "model.safetensors"))
    weights["lm_head.weight"] = weights["model.embed_tokens.weight"].clone()
    save_file(weights, str(tmp_path / "model.safetensors"))
    loaded = load_target(tmp_path)
    assert loaded.lm_head.weight is loaded.model.embed_tokens.weight


@pytest.mark.parametrize("shard", ["../../etc/passwd", "/etc/passwd", "sub/../../x.safetensors"])
def test_an_index_naming_a_file_outside_the_checkpoint_is_refused(tmp_path, shard):
    weight_map = write_sharded(_target("dense"), tmp_path / "ckpt", 2)
    weight_map[next(iter(weight_map))] = shard
    index = tmp_path / "ckpt" / "model.safetensors.index.json"
    index.write_text(json.dumps({"weight_map": weight_map}))
    with pytest.raises(CheckpointError, match=f"shard '{shard}' is not a file inside"):
        read_weights(tmp_path / "ckpt")


@pytest.mark.parametrize("content, says", [
    ("[1, 2, 3]", "must hold a JSON object of config fields, not a list"),
    ('"qwen3"', "must hold a JSON object of config fields, not a str"),
])
def test_a_config_json_that_is_no_object_is_refused(target_dir, content, says):
    (target_dir / "config.json").write_text(content)
    with pytest.raises(CheckpointError, match=says):
        load_target(target_dir)


@pytest.mark.parametrize("field, value, says", [
    ("hidden_size", 10**9, r"hidden_size must be in 1\.\.131072, got 1000000000"),
    ("num_hidden_layers", 10**6, r"num_hidden_layers must be in 1\.\.1024, got 1000000"),
    ("vocab_size", 10**9, r"vocab_size must be in 1\.\.4194304"),
    ("rope_theta", -1, "rope_theta must be a positive number, got -1"),
    ("rms_norm_eps", 0, r"rms_norm_eps must be in \(0, 1\), got 0"),
])
def test_a_config_value_no_real_model_has_is_refused_before_building(target_dir, field, value,
                                                                     says):
    _edit_config(target_dir, lambda raw: raw.update({field: value}))
    with pytest.raises(CheckpointError, match=says):
        load_target(target_dir)
