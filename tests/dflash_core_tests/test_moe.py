"""The routed-expert MoE: grouped and dense paths match a per-expert loop, never sync, load HF keys."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from core_helpers import host_sync_ops, make_target, target_config
from safetensors.torch import load_file

from dflash_core.models import layers
from dflash_core.models.layers import MoE
from dflash_core.models.loader import load_target, save_model
from dflash_core.models.step import Step

ALIGNED = {"hidden_size": 32, "moe_intermediate_size": 16}  # 16-byte rows in fp32 and bf16
UNALIGNED = {"hidden_size": 32, "moe_intermediate_size": 10}  # 40-byte / 20-byte rows
TOLERANCE = {torch.float32: {"atol": 1e-5, "rtol": 1e-5},
             torch.bfloat16: {"atol": 2e-2, "rtol": 2e-2}}


def _moe(dtype: torch.dtype = torch.float32, seed: int = 0, **shape) -> MoE:
    torch.manual_seed(seed)
    return MoE(target_config(moe=True, **(shape or ALIGNED))).to(dtype).eval()


def _tokens(moe: MoE, n: int, seed: int = 1) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    dtype = moe.gate.weight.dtype
    return torch.randn(n, moe.gate.in_features, generator=gen).to(dtype)  # [T, H]


def loop_reference(moe: MoE, tokens: torch.Tensor, weights: torch.Tensor,
                   experts: torch.Tensor) -> torch.Tensor:
    """The former forward: one pass per expert hit, on the HF per-expert weights."""
    state = moe.experts.state_dict(keep_vars=True)  # views that carry gradients
    out = torch.zeros_like(tokens)
    for e in experts.unique().tolist():
        rows, slot = (experts == e).nonzero(as_tuple=True)
        gate, up, down = (state[f"{e}.{n}.weight"] for n in ("gate_proj", "up_proj", "down_proj"))
        x = tokens[rows]
        y = F.linear(F.silu(F.linear(x, gate)) * F.linear(x, up), down)  # [t, H]
        out.index_add_(0, rows, y * weights[rows, slot, None])
    return out


def _reference(moe: MoE, tokens: torch.Tensor) -> torch.Tensor:
    return loop_reference(moe, tokens, *moe.route(tokens))


def _grouped(moe: MoE, tokens: torch.Tensor) -> bool:
    return layers._grouped_mm_ok(tokens, moe.experts.down_proj)


# --- equality with the per-expert loop --------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("n", [1, 7, 64])
def test_grouped_path_matches_the_expert_loop(dtype, n):
    moe = _moe(dtype)
    tokens = _tokens(moe, n)
    assert _grouped(moe, tokens)
    with torch.no_grad():
        torch.testing.assert_close(moe(tokens), _reference(moe, tokens), **TOLERANCE[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_unaligned_sizes_take_the_dense_path_and_match(dtype):
    moe = _moe(dtype, **UNALIGNED)
    tokens = _tokens(moe, 9)
    assert not _grouped(moe, tokens)
    with torch.no_grad():
        torch.testing.assert_close(moe(tokens), _reference(moe, tokens), **TOLERANCE[dtype])


def test_dense_path_matches_on_aligned_sizes_too(monkeypatch):
    moe, tokens = _moe(), _tokens(_moe(), 11)
    monkeypatch.setattr(layers, "_grouped_mm_ok", lambda *args: False)
    with torch.no_grad():
        torch.testing.assert_close(moe(tokens), _reference(moe, tokens), **TOLERANCE[torch.float32])


@pytest.mark.parametrize("route", [[[5, 2], [5, 2], [2, 5]], [[0, 1], [1, 0]], [[5, 4]]])
@pytest.mark.parametrize("shape", [ALIGNED, UNALIGNED])
def test_experts_with_no_tokens_including_the_first_and_last(route, shape):
    moe = _moe(**shape)
    experts = torch.tensor(route)  # [T, k]
    tokens = _tokens(moe, len(experts))
    weights = torch.rand(experts.shape, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        got = moe.experts(tokens, weights, experts)
        torch.testing.assert_close(got, loop_reference(moe, tokens, weights, experts),
                                   **TOLERANCE[torch.float32])


def test_gradients_match_the_expert_loop():
    moe = _moe()
    tokens = _tokens(moe, 6)
    cotangent = torch.randn(6, 32, generator=torch.Generator().manual_seed(3))
    (moe(tokens) * cotangent).sum().backward()
    got = moe.experts.gate_up_proj.grad.clone()
    moe.zero_grad()
    (_reference(moe, tokens) * cotangent).sum().backward()
    torch.testing.assert_close(got, moe.experts.gate_up_proj.grad)


# --- no host syncs ----------------------------------------------------------------------------


def test_the_recorder_sees_the_loop_sync():
    moe, tokens = _moe(), _tokens(_moe(), 5)
    assert {"aten._unique2", "aten.nonzero"} <= host_sync_ops(lambda: _reference(moe, tokens))


@pytest.mark.parametrize("shape", [ALIGNED, UNALIGNED])
@pytest.mark.parametrize("n", [1, 12])
def test_forward_never_syncs(shape, n):
    moe = _moe(**shape)
    tokens = _tokens(moe, n)
    with torch.no_grad():
        assert host_sync_ops(lambda: moe(tokens)) == set()


def test_forward_runs_on_meta_tensors():
    """Meta tensors hold no data: a .tolist() (which the recorder cannot see) would raise."""
    moe = _moe(torch.bfloat16).to("meta")
    tokens = torch.empty(3, 5, 32, dtype=torch.bfloat16, device="meta")
    assert moe(tokens).shape == (3, 5, 32)  # the dense path: meta is not a grouped-mm device
    _, experts = moe.route(tokens.flatten(0, 1))
    grouped = layers._grouped(tokens.flatten(0, 1), experts, moe.experts.gate_up_proj,
                              moe.experts.down_proj)
    assert grouped.shape == (15, 2, 32)


# --- HF checkpoint layout ---------------------------------------------------------------------


def test_state_dict_has_hf_expert_keys_as_views():
    moe = _moe()
    state = moe.state_dict()
    assert "experts.gate_up_proj" not in state and len(state) == 1 + 3 * 6
    assert state["experts.5.down_proj.weight"].shape == (32, 16)
    stacked = moe.experts.gate_up_proj.untyped_storage().data_ptr()
    assert state["experts.3.up_proj.weight"].untyped_storage().data_ptr() == stacked


def test_load_state_dict_fills_the_stacked_weights_in_place():
    source, moe = _moe(seed=0), _moe(seed=9)
    pointer = moe.experts.gate_up_proj.data_ptr()
    result = moe.load_state_dict(source.state_dict())
    assert not result.missing_keys and not result.unexpected_keys
    assert moe.experts.gate_up_proj.data_ptr() == pointer
    assert torch.equal(moe.experts.gate_up_proj, source.experts.gate_up_proj)
    assert torch.equal(moe.experts.down_proj, source.experts.down_proj)


def test_an_incomplete_expert_set_is_reported_not_loaded():
    state = _moe(seed=0).state_dict()
    state.pop("experts.2.up_proj.weight")
    with pytest.raises(RuntimeError, match="experts.gate_up_proj"):
        _moe(seed=9).load_state_dict(state)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_hf_checkpoint_loads_and_gives_the_same_outputs(tmp_path, dtype):
    original = make_target(moe=True)
    save_model(original, tmp_path)
    saved = load_file(str(tmp_path / "model.safetensors"))
    layer = original.model.layers[2].mlp
    tokens = _tokens(layer, 8)
    with torch.no_grad():
        want = loop_reference(layer, tokens, *layer.route(tokens))
    for e in range(6):  # the file holds each expert's own weights in the HF layout
        key = f"model.layers.2.mlp.experts.{e}.gate_proj.weight"
        assert torch.equal(saved[key], layer.experts.gate_up_proj[e, :16])
    loaded = load_target(tmp_path, dtype=dtype)
    ids = torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6]])
    step = Step.causal(torch.zeros(1, dtype=torch.long), ids.shape[1], 0)
    with torch.no_grad():
        torch.testing.assert_close(loaded.model.layers[2].mlp(tokens.to(dtype)), want.to(dtype),
                                   **TOLERANCE[dtype])
        if dtype == torch.float32:
            assert torch.equal(loaded(ids, step)[0], original(ids, step)[0])
