"""A loaded model computes q/k/v with one GEMM and gate/up with one (layers.fuse_projections).

The fused weights are views of one tensor, so the checkpoint's names and values, the memory and
a save of the loaded model stay as they were; the outputs match the unfused model's to fp32
rounding, with fewer GEMMs per forward.
"""

from __future__ import annotations

import torch
from core_helpers import make_drafter, make_target
from torch.utils._python_dispatch import TorchDispatchMode

from dflash_core.models.layers import fuse_projections
from dflash_core.models.loader import load_drafter, load_target, save_model
from dflash_core.models.step import Step

IDS = torch.tensor([[5, 3, 9, 1, 30, 2], [7, 7, 4, 12, 8, 6]])


class _GemmCount(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.gemms = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.gemms += func.__name__ in ("linear.default", "mm.default", "addmm.default")
        return func(*args, **(kwargs or {}))


def _forward(target) -> tuple[torch.Tensor, int]:
    """-> (logits [2, 6, V], GEMMs dispatched) of one causal forward."""
    step = Step.causal(torch.zeros(2, dtype=torch.long), IDS.shape[1], 0)
    with torch.inference_mode(), _GemmCount() as count:
        hidden, _ = target(IDS, step, target.allocate_cache(2, IDS.shape[1]), [])
        logits = target.logits(hidden)
    return logits, count.gemms


def test_a_loaded_target_runs_three_gemms_fewer_per_layer_with_the_same_logits(tmp_path):
    original = make_target()
    save_model(original, tmp_path)
    loaded = load_target(tmp_path)
    want, unfused_gemms = _forward(original)
    got, fused_gemms = _forward(loaded)
    layers = original.config.num_hidden_layers
    assert unfused_gemms - fused_gemms == 3 * layers  # q,k,v -> 1 and gate,up -> 1 per layer
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    assert (got.argmax(-1) == want.argmax(-1)).all()


def test_fused_weights_are_views_and_the_state_dict_is_the_checkpoints(tmp_path):
    original = make_target()
    save_model(original, tmp_path)
    loaded = load_target(tmp_path)
    attn, mlp = loaded.model.layers[0].self_attn, loaded.model.layers[0].mlp
    for part in (attn.q_proj, attn.k_proj, attn.v_proj):
        assert part.weight.untyped_storage().data_ptr() == attn.qkv.untyped_storage().data_ptr()
    assert attn.kv.data_ptr() == attn.k_proj.weight.data_ptr()  # the drafter's context path
    assert mlp.gate_up.data_ptr() == mlp.gate_proj.weight.data_ptr()
    state, want = loaded.state_dict(), original.state_dict()
    assert state.keys() == want.keys()  # no joint weight under a name of its own
    assert all(torch.equal(state[k], want[k]) for k in want)
    save_model(loaded, tmp_path / "again")  # the loaded model saves as any model does
    _, gemms_fused_twice = _forward(fuse_projections(load_target(tmp_path / "again")))
    assert gemms_fused_twice == _forward(loaded)[1]  # fusing twice changes nothing


def test_a_loaded_drafter_projects_its_context_k_v_in_one_gemm(tmp_path):
    target, drafter = make_target(), make_drafter()
    save_model(drafter, tmp_path)
    loaded = load_drafter(tmp_path, target.config)
    ctx = torch.randn(2, 3, drafter.config.layers.hidden_size)
    rope = loaded._rope(torch.arange(3).expand(2, 3))
    with torch.inference_mode(), _GemmCount() as count:
        got = loaded.layers[0].self_attn.project_kv(ctx, rope)
    want = drafter.layers[0].self_attn.project_kv(ctx, drafter._rope(torch.arange(3).expand(2, 3)))
    assert count.gemms == 1
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
