"""INT4 routed experts in the compressed-tensors "pack-quantized" layout (Kimi K2-Thinking on).

Per linear (``{e}.gate_proj``, ``up_proj``, ``down_proj``):
  weight_packed [out, ceil(in / 8)] int32: eight 4-bit values per word, the first in the lowest
                bits, each stored as value + 8 (symmetric int4 in [-8, 7] made unsigned);
  weight_scale  [out, ceil(in / group)]: one scale per group of `group` inputs;
  weight_shape  [2] integers: the unpacked [out, in].
w[o, i] = (nibble - 8) * scale[o, i // group].

The experts are stacked ([E, 2I, H / 8] and [E, H, I / 8]) so one dequantisation feeds the same
grouped GEMM the BF16 experts use. The state dict keeps the per-expert keys above.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from dflash_core.models.errors import CheckpointError
from dflash_core.models.layers import mix_experts

PACK = 8  # 4-bit values per int32 word
OFFSET = 8  # stored value = int4 value + OFFSET
SUFFIXES = ("weight_packed", "weight_scale", "weight_shape")


@dataclass(slots=True, frozen=True)
class Int4Scheme:
    group_size: int = 32

    @classmethod
    def from_config(cls, quant: dict[str, Any]) -> Int4Scheme:
        """From a ``quantization_config``; anything but symmetric group-wise INT4 weights in the
        pack-quantized format is refused."""
        if quant.get("quant_method") != "compressed-tensors":
            raise CheckpointError(f"quant_method {quant.get('quant_method')!r} is not supported "
                                  "(only compressed-tensors pack-quantized INT4)")
        groups = list((quant.get("config_groups") or {}).values())
        if len(groups) != 1:
            raise CheckpointError("quantization_config needs exactly one config group")
        (group,) = groups
        fmt = group.get("format") or quant.get("format")
        weights = group.get("weights") or {}
        wanted = {"num_bits": 4, "type": "int", "symmetric": True, "strategy": "group"}
        wrong = {k: weights.get(k) for k, v in wanted.items() if weights.get(k) != v}
        if fmt != "pack-quantized" or wrong or group.get("input_activations"):
            raise CheckpointError(f"quantization scheme not supported: format {fmt!r}, "
                                  f"weights {wrong or 'ok'}, input_activations "
                                  f"{group.get('input_activations')!r}")
        group_size = int(weights.get("group_size") or 32)
        if group_size % PACK:
            raise CheckpointError(f"group_size {group_size} is not a multiple of {PACK}")
        return cls(group_size)

    def to_config(self) -> dict[str, Any]:
        weights = {"num_bits": 4, "type": "int", "symmetric": True, "strategy": "group",
                   "group_size": self.group_size, "dynamic": False, "actorder": None}
        # Everything but the routed experts stays BF16 (what Kimi K2-Thinking ships).
        return {"quant_method": "compressed-tensors", "format": "pack-quantized",
                "quantization_status": "compressed",
                "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights,
                                              "input_activations": None,
                                              "output_activations": None}},
                "ignore": ["lm_head", "re:.*self_attn.*", "re:.*shared_experts.*",
                           "re:.*mlp\\.(gate|up|down)_proj.*"]}


def quantize(weight: Tensor, group: int) -> tuple[Tensor, Tensor]:
    """[out, in] float -> (packed [out, ceil(in/8)] int32, scale [out, ceil(in/group)]):
    symmetric round-to-nearest with scale = max |w| / 7 per group (fixtures, tests)."""
    out, cols = weight.shape
    w = nn.functional.pad(weight.float(), (0, -cols % group)).view(out, -1, group)
    scale = (w.abs().amax(-1, keepdim=True) / 7).clamp_min(1e-8)  # [out, G, 1]
    q = (w / scale).round().clamp(-8, 7).to(torch.int32).view(out, -1)[:, :cols]
    return pack(q), scale[..., 0].to(weight.dtype)


def pack(q: Tensor) -> Tensor:
    """[..., in] int values in [-8, 7] -> [..., ceil(in / 8)] int32 words."""
    q = nn.functional.pad(q + OFFSET, (0, -q.shape[-1] % PACK)).to(torch.int64)
    shifts = torch.arange(0, 4 * PACK, 4, device=q.device)
    words = (q.unflatten(-1, (-1, PACK)) << shifts).sum(-1)  # [..., in / 8] in [0, 2**32)
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)


def dequantize(packed: Tensor, scale: Tensor, cols: int, group: int,
               dtype: torch.dtype) -> Tensor:
    """[..., out, W] packed + [..., out, G] scales -> [..., out, cols] weights in `dtype`.

    Written in place into one `dtype` buffer, a nibble position at a time, so the only
    temporaries are an eighth of it in int32: a whole Kimi MoE layer dequantises in ~1.25x its
    BF16 size, not 4x."""
    groups = scale.shape[-1]
    out = torch.full((*packed.shape[:-1], groups * group // PACK, PACK), OFFSET, dtype=dtype,
                     device=packed.device)  # [..., G*group/8, 8]: padding words decode to 0
    for i in range(PACK):
        out[..., : packed.shape[-1], i] = (packed >> (4 * i)) & 0xF
    out = out.flatten(-2).sub_(OFFSET)  # [..., G*group]
    out.view(*out.shape[:-1], groups, group).mul_(scale.to(dtype)[..., None])
    return out[..., :cols]


class Int4Experts(nn.Module):
    """E SwiGLU experts with INT4 weights, dequantised into the compute dtype in the expert GEMM
    (correct everywhere; no fused INT4 kernel yet, see docs/ENGINE.md)."""

    def __init__(self, num_experts: int, hidden: int, intermediate: int, group: int) -> None:
        super().__init__()
        self.num_experts, self.hidden, self.intermediate = num_experts, hidden, intermediate
        self.group = group
        for name, rows, cols in self._stacks():
            self.register_buffer(f"{name}_packed", torch.zeros(
                num_experts, rows, -(-cols // PACK), dtype=torch.int32))
            self.register_buffer(f"{name}_scale", torch.ones(num_experts, rows, -(-cols // group)))
        self.register_state_dict_post_hook(_split_int4)
        self.register_load_state_dict_pre_hook(_stack_int4)

    def _stacks(self) -> tuple[tuple[str, int, int], ...]:
        return (("gate_up", 2 * self.intermediate, self.hidden),
                ("down", self.hidden, self.intermediate))

    def dequantized(self, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """(gate_up [E, 2I, H], down [E, H, I]) in `dtype`."""
        return tuple(dequantize(getattr(self, f"{name}_packed"), getattr(self, f"{name}_scale"),
                                cols, self.group, dtype) for name, _, cols in self._stacks())

    @torch.no_grad()
    def quantize_from(self, gate_up: Tensor, down: Tensor) -> None:
        """Fill the stacks from float experts [E, 2I, H] and [E, H, I] (fixtures, benchmarks)."""
        for (name, _, _), weight in zip(self._stacks(), (gate_up, down), strict=True):
            packed, scale = quantize(weight.flatten(0, 1), self.group)
            getattr(self, f"{name}_packed").copy_(packed.view_as(getattr(self, f"{name}_packed")))
            getattr(self, f"{name}_scale").copy_(scale.view_as(getattr(self, f"{name}_scale")))

    def forward(self, tokens: Tensor, weights: Tensor, experts: Tensor) -> Tensor:
        """tokens [T, H], routing weights and expert ids [T, k] -> [T, H]. With fewer routed
        (token, slot) pairs than experts (decode, small trees) only the routed experts' INT4
        weights are read and dequantised, pair by pair; otherwise every expert once, into the
        grouped GEMM. The choice reads shapes only, so a captured graph keeps it."""
        if experts.numel() < self.num_experts:
            return self._per_pair(tokens, weights, experts)
        gate_up, down = self.dequantized(tokens.dtype)  # [E, 2I, H], [E, H, I]
        return mix_experts(tokens, weights, experts, gate_up, down)

    def _per_pair(self, tokens: Tensor, weights: Tensor, experts: Tensor) -> Tensor:
        ids = experts.flatten()  # [P = T*k]
        gate_up = dequantize(self.gate_up_packed[ids], self.gate_up_scale[ids], self.hidden,
                             self.group, tokens.dtype)  # [P, 2I, H]
        down = dequantize(self.down_packed[ids], self.down_scale[ids], self.intermediate,
                          self.group, tokens.dtype)  # [P, H, I]
        x = tokens.repeat_interleave(experts.shape[1], dim=0)[:, None]  # [P, 1, H]
        gate, up = (x @ gate_up.mT).chunk(2, dim=-1)  # [P, 1, I] each
        y = (nn.functional.silu(gate) * up) @ down.mT  # [P, 1, H]
        return (y.view(*experts.shape, -1) * weights[..., None]).sum(1)  # [T, H]

    def per_expert(self, name: str) -> list[tuple[str, Tensor, Tensor, tuple[int, int]]]:
        """(linear name, packed view, scale view, [out, in]) of every expert, HF key order."""
        packed, scale = getattr(self, f"{name}_packed"), getattr(self, f"{name}_scale")
        if name == "down":
            return [(f"{e}.down_proj", packed[e], scale[e], (self.hidden, self.intermediate))
                    for e in range(self.num_experts)]
        halves = zip(packed.split(self.intermediate, 1), scale.split(self.intermediate, 1))
        shape = (self.intermediate, self.hidden)
        return [(f"{e}.{proj}", p[e], s[e], shape) for proj, (p, s) in
                zip(("gate_proj", "up_proj"), halves) for e in range(self.num_experts)]

    def linears(self) -> list[tuple[str, Tensor, Tensor, tuple[int, int]]]:
        return self.per_expert("gate_up") + self.per_expert("down")


def _split_int4(module: Int4Experts, state: dict[str, Tensor], prefix: str, _meta) -> None:
    """state_dict post-hook: stacks -> the compressed-tensors per-expert keys (views)."""
    for name, _, _ in module._stacks():
        state.pop(f"{prefix}{name}_packed")
        state.pop(f"{prefix}{name}_scale")
    for linear, packed, scale, shape in module.linears():
        state[f"{prefix}{linear}.weight_packed"] = packed
        state[f"{prefix}{linear}.weight_scale"] = scale
        state[f"{prefix}{linear}.weight_shape"] = torch.tensor(shape, dtype=torch.int32)


def _stack_int4(module: Int4Experts, state: dict[str, Tensor], prefix: str, *_rest) -> None:
    """load_state_dict pre-hook: per-expert keys -> slices of the stacks, in place. A stored
    weight_shape that is not the module's is refused; an incomplete set is left for
    load_state_dict to report."""
    linears = module.linears()
    keys = [f"{prefix}{linear}.{suffix}" for linear, *_ in linears for suffix in SUFFIXES]
    if any(key not in state for key in keys):
        return
    with torch.no_grad():
        for linear, packed, scale, shape in linears:
            stored = tuple(int(v) for v in state[f"{prefix}{linear}.weight_shape"])
            if stored != shape:
                raise CheckpointError(f"{prefix}{linear}.weight_shape {stored} != {shape}")
            packed.copy_(state[f"{prefix}{linear}.weight_packed"])
            scale.copy_(state[f"{prefix}{linear}.weight_scale"])
    for key in keys:
        del state[key]
    for name, _, _ in module._stacks():
        state[f"{prefix}{name}_packed"] = getattr(module, f"{name}_packed")
        state[f"{prefix}{name}_scale"] = getattr(module, f"{name}_scale")
