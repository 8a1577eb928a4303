"""Qwen3 building blocks: RMSNorm, rotary embedding, SwiGLU MLP and the routed-expert MoE."""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from dflash_core.models.config import ModelConfig
from dflash_core.models.yarn import YarnScaling


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        # One op in fp32: on CPU bit for bit x * rsqrt(mean(x^2) + eps) * weight (tested).
        # Otherwise normalise in fp32 as Qwen3 does (bf16 variance loses the small components)
        # and round before the weight, as Qwen3 does.
        if x.dtype == torch.float32 == self.weight.dtype:
            return F.rms_norm(x, self.weight.shape, self.weight, self.eps)
        normed = F.rms_norm(x.float(), self.weight.shape, eps=self.eps)
        return self.weight * normed.to(x.dtype)


def cast(x: Tensor, dtype: torch.dtype) -> Tensor:
    """x as dtype, without dispatching an op when it already is (most casts in fp32)."""
    return x if x.dtype == dtype else x.to(dtype)


def rope_tables(head_dim: int, theta: float, positions: Tensor,
                yarn: YarnScaling | None = None) -> tuple[Tensor, Tensor]:
    """cos/sin for explicit positions, so tree siblings can share a position: [B, N, D] each."""
    if yarn is None:
        dims = torch.arange(0, head_dim, 2, device=positions.device)
        inv_freq = 1.0 / theta ** (dims / head_dim)
    else:
        inv_freq = yarn.inv_freq(head_dim, theta, positions.device)
    angles = positions.float()[..., None] * inv_freq  # [B, N, D/2]
    angles = torch.cat([angles, angles], dim=-1)  # [B, N, D]
    if yarn is None:
        return angles.cos(), angles.sin()
    return angles.cos() * yarn.cos_sin_factor, angles.sin() * yarn.cos_sin_factor


class HeadRope(NamedTuple):
    """RoPE tables made once per forward for every layer's heads: cos [B, 1, N, D] and sin
    with its first half negated, so rotate-half is one roll: x * cos + roll(x) * sin_signed
    equals x * cos + cat(-x2, x1) * sin bit for bit (a sign flip is exact)."""

    cos: Tensor  # [B, 1, N, D]
    sin_signed: Tensor  # [B, 1, N, D]


def head_rope(rope: tuple[Tensor, Tensor], dtype: torch.dtype) -> HeadRope:
    """rope_tables' (cos, sin) [B, N, D] -> HeadRope in `dtype`; a HeadRope is returned as is."""
    if isinstance(rope, HeadRope):
        return rope
    cos, sin = rope
    half = sin.shape[-1] // 2
    sin_signed = torch.cat([-sin[..., :half], sin[..., half:]], dim=-1)
    return HeadRope(cast(cos[:, None], dtype), cast(sin_signed[:, None], dtype))


def rotate(x: Tensor, rope: HeadRope) -> Tensor:
    """x: [B, H, N, D] rotated at its positions (rotate-half convention of the HF Qwen3
    weights)."""
    return x * rope.cos + x.roll(x.shape[-1] // 2, -1) * rope.sin_signed


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """x: [B, H, N, D]; cos/sin: [B, N, D] as rope_tables makes them. For callers that rotate
    once per table (MLA); the layers of a forward share a HeadRope and call `rotate`."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cast(cos[:, None], x.dtype) + rotated * cast(sin[:, None], x.dtype)


def fuse_projections(model: nn.Module) -> nn.Module:
    """Fuse every projection group of a loaded model (attention's q/k/v, an MLP's gate/up) into
    one GEMM each: at decode sizes a GEMM costs its dispatch (CPU) or launch (GPU), not its
    FLOPs, so a layer's seven become four. Memory, names and state dict are unchanged
    (`joint_weight`). Inference only: training a fused module would train views."""
    for module in model.modules():
        if module is not model and hasattr(module, "fuse_projections"):
            module.fuse_projections()
    return model


def joint_weight(linears: list[nn.Module]) -> Tensor | None:
    """The linears' weights concatenated by output row, each linear's weight made a view of
    its rows; None (nothing changed) unless all are plain bias-free nn.Linear (an INT4 or a
    parallel linear keeps its own forward)."""
    if not all(type(lin) is nn.Linear and lin.bias is None for lin in linears):
        return None
    with torch.no_grad():
        joint = torch.cat([lin.weight for lin in linears])
    rows = [lin.weight.shape[0] for lin in linears]
    for lin, part in zip(linears, joint.split(rows), strict=True):
        lin.weight = nn.Parameter(part, requires_grad=False)
    return joint


class MLP(nn.Module):
    def __init__(self, hidden: int, intermediate: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)
        self.register_buffer("gate_up", None, persistent=False)  # fuse_projections' [2I, H]

    def fuse_projections(self) -> None:
        if self.gate_up is None:
            self.gate_up = joint_weight([self.gate_proj, self.up_proj])

    def forward(self, x: Tensor) -> Tensor:
        if self.gate_up is None:
            return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))
        gate, up = F.linear(x, self.gate_up).chunk(2, -1)  # [.., I] each
        return self.down_proj(F.silu(gate) * up)


class MoE(nn.Module):
    """Qwen3-MoE sparse block: softmax router, top-k experts, optional renormalised weights.

    forward reads nothing back to the host and makes no data-dependent shape, so a CUDA graph
    can capture it.
    """

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.top_k = cfg.num_experts_per_tok
        self.norm_topk_prob = cfg.norm_topk_prob
        self.gate = nn.Linear(cfg.hidden_size, cfg.num_experts, bias=False)
        self.experts = Experts(cfg.num_experts, cfg.hidden_size, cfg.moe_intermediate_size)

    def forward(self, x: Tensor) -> Tensor:
        shape = x.shape
        tokens = x.reshape(-1, shape[-1])  # [T, H]
        weights, experts = self.route(tokens)  # [T, k], [T, k]
        return self.experts(tokens, weights, experts).reshape(shape)

    def route(self, tokens: Tensor) -> tuple[Tensor, Tensor]:
        probs = F.softmax(self.gate(tokens).float(), dim=-1)  # [T, E]
        weights, experts = probs.topk(self.top_k, dim=-1)
        if self.norm_topk_prob:
            weights = weights / weights.sum(-1, keepdim=True)
        return weights.to(tokens.dtype), experts


class Experts(nn.Module):
    """E SwiGLU experts stacked into [E, out, in] weights, read by grouped GEMMs.

    The state dict keeps the HF per-expert keys (``{e}.gate_proj.weight``, ...): they are views of
    the stacked weights when saved and are copied into slices of them when loaded.
    """

    def __init__(self, num_experts: int, hidden: int, intermediate: int) -> None:
        super().__init__()
        self.num_experts, self.intermediate = num_experts, intermediate
        self.gate_up_proj = nn.Parameter(torch.empty(num_experts, 2 * intermediate, hidden))
        self.down_proj = nn.Parameter(torch.empty(num_experts, hidden, intermediate))
        self.reset_parameters()
        self.register_state_dict_post_hook(_split_experts)
        self.register_load_state_dict_pre_hook(_stack_experts)

    def reset_parameters(self) -> None:
        # Expert by expert in nn.Linear's order and init, so a seed gives the weights it gave
        # when each expert was an MLP module.
        for gate, up, down in self.per_expert(self.gate_up_proj.data, self.down_proj.data):
            for weight in (gate, up, down):
                nn.init.kaiming_uniform_(weight, a=math.sqrt(5))

    def per_expert(self, gate_up: Tensor, down: Tensor) -> list[tuple[Tensor, Tensor, Tensor]]:
        """(gate [I, H], up [I, H], down [H, I]) views for each expert."""
        gate, up = gate_up.split(self.intermediate, dim=1)
        return list(zip(gate.unbind(0), up.unbind(0), down.unbind(0), strict=True))

    def forward(self, tokens: Tensor, weights: Tensor, experts: Tensor) -> Tensor:
        """tokens [T, H], routing weights and expert ids [T, k] -> weighted expert sum [T, H]."""
        return mix_experts(tokens, weights, experts, self.gate_up_proj, self.down_proj)


def mix_experts(tokens: Tensor, weights: Tensor, experts: Tensor, gate_up: Tensor,
                down: Tensor) -> Tensor:
    """Each token through its k routed SwiGLU experts, weighted: [T, H].

    tokens [T, H]; weights, experts [T, k]; gate_up [E, 2I, H] (gate rows first); down [E, H, I].
    """
    if _grouped_mm_ok(tokens, down):
        y = _grouped(tokens, experts, gate_up, down)  # [T, k, H]
        return (y * weights[..., None]).sum(1)
    return _dense(tokens, weights, experts, gate_up, down)


def _grouped(tokens: Tensor, experts: Tensor, gate_up: Tensor, down: Tensor) -> Tensor:
    """Each (token, slot) pair through its expert: [T, k, H]. Rows are sorted by expert so each
    expert's weights are read once; group ends come from a search, not a host count."""
    flat = experts.flatten()  # [T*k]
    sorted_ids, order = flat.sort(stable=True)  # [T*k], [T*k]
    ids = torch.arange(down.shape[0], device=flat.device)  # [E]
    ends = torch.searchsorted(sorted_ids, ids, right=True, out_int32=True)  # [E]
    x = tokens.index_select(0, order // experts.shape[1])  # [T*k, H]
    h = torch._grouped_mm(x, gate_up.mT, offs=ends)  # [T*k, 2I]
    gate, up = h.chunk(2, dim=-1)
    y = torch._grouped_mm(F.silu(gate) * up, down.mT, offs=ends)  # [T*k, H]
    # Back to (token, slot) order by a copy to distinct rows: deterministic, unlike
    # accumulating with index_add_, whose CUDA atomics add in any order.
    return torch.empty_like(y).index_copy_(0, order, y).view(*experts.shape, -1)


def _dense(tokens: Tensor, weights: Tensor, experts: Tensor, gate_up: Tensor,
           down: Tensor) -> Tensor:
    """Every expert on every token, weighted by a [T, E] matrix that is zero off the route:
    E/k times the FLOPs of _grouped, for shapes, dtypes or devices _grouped_mm refuses.
    Adds rather than writes the weights: a rank holding some experts routes the others to
    one of its own with weight 0 (parallel.modules.ShardedExperts)."""
    dense = torch.zeros(len(tokens), down.shape[0], dtype=weights.dtype,
                        device=weights.device).scatter_add_(1, experts, weights)  # [T, E]
    gate, up = torch.matmul(tokens, gate_up.mT).chunk(2, dim=-1)  # [E, T, I]
    y = torch.matmul(F.silu(gate) * up, down.mT)  # [E, T, H]
    return torch.einsum("te,eth->th", dense, y)


def _grouped_mm_ok(x: Tensor, down: Tensor) -> bool:
    """Whether torch._grouped_mm takes x and the [E, H, I] expert weights without a host sync.

    Reads only host facts (dtype, shape, device), so the choice is fixed for a captured graph."""
    if not hasattr(torch, "_grouped_mm") or down.dtype != x.dtype:
        return False
    # Every operand's row stride must be a multiple of 16 bytes; each is H or I elements.
    if any(n * x.element_size() % 16 for n in down.shape[1:]):
        return False
    if x.device.type == "cpu":
        return x.dtype in (torch.float32, torch.bfloat16, torch.float16)
    # On CUDA only the bf16 sm90/sm100 kernel reads the offsets on the device; every other case
    # falls back to a per-group loop that copies them to the host.
    return x.device.type == "cuda" and x.dtype == torch.bfloat16 and _sm90_or_sm100(x.device.index)


@functools.cache
def _sm90_or_sm100(index: int) -> bool:
    return torch.version.hip is None and torch.cuda.get_device_capability(index)[0] in (9, 10)


def _split_experts(module: Experts, state: dict[str, Tensor], prefix: str, _meta) -> None:
    """state_dict post-hook: stacked weights -> HF per-expert keys (views, no copies)."""
    gate_up, down = state.pop(prefix + "gate_up_proj"), state.pop(prefix + "down_proj")
    for e, views in enumerate(module.per_expert(gate_up, down)):
        for name, view in zip(_EXPERT_NAMES, views, strict=True):
            state[f"{prefix}{e}.{name}.weight"] = view


def _stack_experts(module: Experts, state: dict[str, Tensor], prefix: str, *_rest) -> None:
    """load_state_dict pre-hook: HF per-expert keys -> slices of the stacked weights.

    Copies in place and hands load_state_dict the parameters themselves, so a checkpoint never
    exists twice. Incomplete or misshapen sets are left alone for load_state_dict to report."""
    keys = [f"{prefix}{e}.{name}.weight" for e in range(module.num_experts)
            for name in _EXPERT_NAMES]
    slots = [view for views in module.per_expert(module.gate_up_proj.data, module.down_proj.data)
             for view in views]
    found = [state.get(key) for key in keys]
    if any(w is None or w.shape != slot.shape for w, slot in zip(found, slots, strict=True)):
        return
    with torch.no_grad():
        for w, slot in zip(found, slots, strict=True):
            slot.copy_(w)
    for key in keys:
        del state[key]
    state[prefix + "gate_up_proj"] = module.gate_up_proj
    state[prefix + "down_proj"] = module.down_proj


_EXPERT_NAMES = ("gate_proj", "up_proj", "down_proj")
