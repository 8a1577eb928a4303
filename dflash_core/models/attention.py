"""Attention for a batch of new tokens over a cached prefix plus each other.

The prefix part runs with no per-node mask: every new token of a row sees that row's whole
committed prefix, so one grouped matmul reads each prefix K/V once for all N tokens and all the
query heads sharing it (GQA heads are grouped by a view, never copied). Only the N x N part among
the new tokens is masked. The two score blocks share one softmax (explicit matmuls), or, with
PyTorch's fused kernels, the two partial softmaxes are merged by their log-sum-exp.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from dflash_core.models.config import ModelConfig
from dflash_core.models.kv_cache import KVCache
from dflash_core.models.layers import HeadRope, RMSNorm, cast, head_rope, joint_weight, rotate
from dflash_core.models.step import Step


def attend(q: Tensor, prefix: tuple[Tensor, Tensor] | None, prefix_lens: Tensor,
           k_new: Tensor, v_new: Tensor, mask: Tensor, fused: bool = False,
           scale: float | None = None, biases: dict | None = None) -> Tensor:
    """q: [B, Hq, N, D]; prefix K/V: [B, Hkv, S, D] / [.., Dv]; k_new/v_new: [B, Hkv, N, D] /
    [.., Dv]; mask: [B, N, N]. Softmax scale D**-0.5 unless `scale` is given.

    ``fused`` computes each part with PyTorch's fused attention kernel (flash on CPU,
    memory-efficient on CUDA: no [.., N, S] score tensor) instead of explicit matmuls.
    ``biases``, a forward's memo (Step.biases), makes the mask, prefix-length and joint biases
    once per forward instead of once per layer. Returns [B, Hq, N, Dv]."""
    b, hq, n, d = q.shape
    groups = hq // k_new.shape[1]
    scale = d**-0.5 if scale is None else scale
    qg = q.reshape(b, -1, groups * n, d) * scale  # [B, Hkv, G*N, D]: row g*N + n
    biases = {} if biases is None else biases
    if ("tree", groups) not in biases:
        biases["tree", groups] = _additive(mask)[:, None].repeat(1, 1, groups, 1)  # [B,1,G*N,N]
    tree = biases["tree", groups]
    keys = prefix[0].shape[2] if prefix is not None else 0
    if keys and ("length", keys) not in biases:
        visible = torch.arange(keys, device=q.device) < prefix_lens[:, None]  # [B, S]
        biases["length", keys] = _additive(visible)[:, None, None]  # [B, 1, 1, S]
    if not fused and not keys:
        out = _new_only(qg, k_new, v_new, tree)
    elif not fused:
        if ("joint", groups, keys) not in biases:
            length = biases["length", keys].expand(-1, -1, tree.shape[2], -1)
            biases["joint", groups, keys] = torch.cat([length, tree], -1)  # [B,1,G*N,S+N]
        out = _joint(qg, prefix, k_new, v_new, biases["joint", groups, keys])
    else:
        out, lse = _fused_partial(qg, k_new, v_new, tree)
        if keys:
            out, lse = _merge(out, lse, *_fused_partial(qg, prefix[0], prefix[1],
                                                        biases["length", keys]))
    return cast(out.reshape(b, hq, n, v_new.shape[-1]), q.dtype)


def _additive(visible: Tensor) -> Tensor:
    return torch.zeros(visible.shape, device=visible.device).masked_fill(~visible, float("-inf"))


def _partial(qg: Tensor, k: Tensor, v: Tensor, bias: Tensor) -> tuple[Tensor, Tensor]:
    """Softmax attention over one key set, with its log-sum-exp for merging (fp32 softmax): the
    explicit form the fused kernels' partials and the joint softmax are checked against."""
    scores = cast(qg @ k.transpose(-1, -2), torch.float32) + bias  # [B, Hkv, G*N, S]
    lse = torch.logsumexp(scores, dim=-1, keepdim=True)  # [B, Hkv, G*N, 1]
    # A row with an empty prefix has lse = -inf; clamping makes its weights 0, not NaN.
    probs = torch.exp(scores - lse.clamp_min(torch.finfo(lse.dtype).min))
    return cast(cast(probs, v.dtype) @ v, torch.float32), lse  # [B, Hkv, G*N, D]


def _new_only(qg: Tensor, k: Tensor, v: Tensor, bias: Tensor) -> Tensor:
    """Attention among the new tokens alone (a prefill: no prefix): one fp32 softmax, no
    log-sum-exp to merge (logsumexp + exp were a third of a 64-token prefill's attention).
    Every row sees at least itself (causal and ancestor masks include the diagonal), so no
    row is all -inf. -> [B, Hkv, G*N, Dv] fp32."""
    scores = cast(qg @ k.transpose(-1, -2), torch.float32) + bias  # [B, Hkv, G*N, N]
    return cast(cast(torch.softmax(scores, -1), v.dtype) @ v, torch.float32)


def _joint(qg: Tensor, prefix: tuple[Tensor, Tensor], k_new: Tensor, v_new: Tensor,
           bias: Tensor) -> Tensor:
    """One fp32 softmax over the prefix keys and the new ones side by side: fewer ops than two
    `_partial`s and a merge. The scores are [B, Hkv, G*N, S+N]; the prefix K/V are read in
    place, never concatenated with the new ones. bias: the forward's [B, 1, G*N, S+N].
    -> [B, Hkv, G*N, Dv] fp32."""
    keys = prefix[0].shape[2]
    scores = torch.cat([qg @ prefix[0].transpose(-1, -2), qg @ k_new.transpose(-1, -2)], -1)
    probs = cast(torch.softmax(cast(scores, torch.float32) + bias, -1), v_new.dtype)
    return (cast(probs[..., :keys] @ prefix[1], torch.float32)
            + cast(probs[..., keys:] @ v_new, torch.float32))


def _fused_partial(qg: Tensor, k: Tensor, v: Tensor, bias: Tensor) -> tuple[Tensor, Tensor]:
    """``_partial`` through a fused kernel that also returns the log-sum-exp. `bias` keeps its
    broadcast shape ([B, 1, 1, S] for a prefix, [B, 1, G*N, N] for the tree) and reaches the
    kernel as an expanded view, so no [B, Hkv, G*N, S] mask is ever allocated."""
    b, h, rows, _ = qg.shape
    mask = _aligned(bias, qg.dtype).expand(b, h, rows, k.shape[2])  # stride 0 where broadcast
    kernel = _efficient_attention if qg.device.type == "cuda" else _flash_attention_cpu
    out, lse = kernel(qg, k, v, mask)
    # A row that sees no key (an empty prefix) must weigh nothing in the merge; the kernels
    # report lse 0 for it.
    seen = torch.isfinite(bias).any(-1, keepdim=True)  # [B, 1, rows or 1, 1]
    lse = lse.float()[..., None].masked_fill(~seen, float("-inf"))
    return out.float().masked_fill(~seen, 0.0), lse


def _aligned(bias: Tensor, dtype: torch.dtype, multiple: int = 16) -> Tensor:
    """`bias` [..., S] as `dtype`, in rows padded to a multiple of 16 elements and sliced back
    to S: the memory-efficient kernel wants every bias row to start aligned. Same shape as
    `bias`; expanded, it is the form scaled_dot_product_attention itself hands that kernel."""
    keys = bias.shape[-1]
    width = -(-keys // multiple) * multiple
    padded = torch.zeros(*bias.shape[:-1], width, dtype=dtype, device=bias.device)  # [.., S_pad]
    padded[..., :keys] = bias
    return padded[..., :keys]


def _efficient_attention(qg: Tensor, k: Tensor, v: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    """CUDA: memory-efficient kernel; `mask` may be broadcast (stride 0) in all but its last dim."""
    out, lse = torch.ops.aten._scaled_dot_product_efficient_attention(
        qg, k, v, mask, True, scale=1.0)[:2]
    return out, lse[..., : qg.shape[2]]  # the kernel pads its log-sum-exp rows


def _flash_attention_cpu(qg: Tensor, k: Tensor, v: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        qg, k, v, attn_mask=mask, scale=1.0)[:2]
    return out, lse


def _merge(out_a: Tensor, lse_a: Tensor, out_b: Tensor, lse_b: Tensor) -> tuple[Tensor, Tensor]:
    lse = torch.logaddexp(lse_a, lse_b)
    return out_a * torch.exp(lse_a - lse) + out_b * torch.exp(lse_b - lse), lse


class Attention(nn.Module):
    """Qwen3 attention: GQA, per-head RMSNorm on q and k, RoPE at explicit positions."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.n_heads, self.n_kv, self.head_dim = (
            cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim)
        self.q_proj = nn.Linear(cfg.hidden_size, self.n_heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(cfg.hidden_size, self.n_kv * self.head_dim, bias=False)
        self.v_proj = nn.Linear(cfg.hidden_size, self.n_kv * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.n_heads * self.head_dim, cfg.hidden_size, bias=False)
        self.q_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps)
        self.k_norm = RMSNorm(self.head_dim, cfg.rms_norm_eps)
        # fuse_projections' joint [q; k; v] weight and its [k; v] rows (views of one tensor)
        self.register_buffer("qkv", None, persistent=False)
        self.register_buffer("kv", None, persistent=False)

    def fuse_projections(self) -> None:
        if self.qkv is None:
            self.qkv = joint_weight([self.q_proj, self.k_proj, self.v_proj])
            if self.qkv is not None:
                self.kv = self.qkv[self.q_proj.weight.shape[0]:]

    def project_qkv(self, x: Tensor, rope: HeadRope | tuple[Tensor, Tensor]
                    ) -> tuple[Tensor, Tensor, Tensor]:
        """x: [B, N, H] -> q [B, Hq, N, D], k, v [B, Hkv, N, D]: one GEMM once fused."""
        if self.qkv is None:
            return self.project_q(x, rope), *self.project_kv(x, rope)
        q, k, v = F.linear(x, self.qkv).split(self._widths(), -1)
        return self._q(q, rope), *self._kv(k, v, rope)

    def project_q(self, x: Tensor, rope: HeadRope | tuple[Tensor, Tensor]) -> Tensor:
        """x: [B, N, H] -> q: [B, Hq, N, D] (normed and rotated). `rope`: the forward's HeadRope
        (or rope_tables' pair, prepared here)."""
        return self._q(self.q_proj(x), rope)

    def project_kv(self, x: Tensor, rope: HeadRope | tuple[Tensor, Tensor]
                   ) -> tuple[Tensor, Tensor]:
        """x: [B, N, H] -> k, v: [B, Hkv, N, D] (k normed and rotated)."""
        if self.kv is None:
            return self._kv(self.k_proj(x), self.v_proj(x), rope)
        return self._kv(*F.linear(x, self.kv).split(self._widths()[1:], -1), rope)

    def _q(self, q: Tensor, rope: HeadRope | tuple[Tensor, Tensor]) -> Tensor:
        q = self.q_norm(self._heads(q, self.n_heads))
        return rotate(q, head_rope(rope, q.dtype))

    def _kv(self, k: Tensor, v: Tensor, rope: HeadRope | tuple[Tensor, Tensor]
            ) -> tuple[Tensor, Tensor]:
        k = self.k_norm(self._heads(k, self.n_kv))
        return rotate(k, head_rope(rope, k.dtype)), self._heads(v, self.n_kv)

    def _widths(self) -> list[int]:
        return [self.q_proj.weight.shape[0], self.k_proj.weight.shape[0],
                self.v_proj.weight.shape[0]]

    def project_out(self, out: Tensor) -> Tensor:
        return self.o_proj(out.transpose(1, 2).flatten(2))  # [B, Hq, N, D] -> [B, N, H]

    def forward(self, x: Tensor, rope: HeadRope | tuple[Tensor, Tensor], step: Step,
                cache: KVCache | None, layer: int) -> Tensor:
        """Writes the new K/V to `step.slots` after reading the prefix, so a node never sees
        its own scratch slot through the prefix path. With no cache (training) the new tokens
        attend only to each other."""
        q, k, v = self.project_qkv(x, rope)  # [B, Hq, N, D], [B, Hkv, N, D] x 2
        prefix = cache.prefix(layer, step.read_len) if cache is not None else None
        out = attend(q, prefix, step.prefix_lens, k, v, step.mask, step.fused,
                     biases=step.biases)  # [B, Hq, N, D]
        if cache is not None:
            cache.write(layer, step.slots, k, v)
        return self.project_out(out)  # [B, N, H]

    def _heads(self, x: Tensor, heads: int) -> Tensor:
        return x.unflatten(-1, (heads, self.head_dim)).transpose(1, 2)  # [B, heads, N, D]
