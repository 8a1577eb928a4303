"""DFlash drafter training: target-regenerated responses, random anchors, weighted block loss.

Each training block is what inference drafts: slot 0 holds the real anchor token's embedding,
slots 1..bs-1 the mask token, and the block sees the target features of every position before
its anchor (through the drafter's own K/V projections) plus itself, bidirectionally. Slot k is
trained to predict the token at anchor + k with weight exp(-(k-1)/gamma). The target's embedding
and LM head are shared and frozen.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from dflash_core.models.drafter import Drafter
from dflash_core.models.layers import rope_tables
from dflash_core.models.target import Target
from dflash_core.runtime.engine import Engine, EngineConfig
from dflash_core.speculation.spec import SamplingParams
from dflash_core.training.optim import Progress, Schedule, fit
from dflash_core.training.target_train import causal_step


@dataclass(slots=True)
class DraftData:
    tokens: Tensor  # [S, T] prompt + target's greedy response
    features: Tensor  # [S, T, F] target features (tapped layers) of every position
    prompt_len: int


@torch.inference_mode()
def regenerate(target: Target, prompts: Tensor, response_len: int, taps: list[int],
               batch: int = 64) -> DraftData:
    """Greedy continuations by the target itself (the recipe trains on the target's outputs)."""
    engine = Engine(target, None, EngineConfig(max_batch=batch,
                                               max_context=prompts.shape[1] + response_len + 1,
                                               max_tree_nodes=1))
    rows = []
    for chunk in prompts.split(batch):
        out = engine.generate(chunk.tolist(), SamplingParams(max_tokens=response_len))
        rows += [p + t for p, t in zip(chunk.tolist(), out.tokens)]
    tokens = torch.tensor(rows)  # [S, T]
    features = torch.cat([target(chunk, causal_step(*chunk.shape), None, taps)[1]
                          for chunk in tokens.split(batch)])
    return DraftData(tokens, features, prompts.shape[1])


def block_loss(drafter: Drafter, target: Target, data: DraftData, rows: Tensor, anchors: Tensor,
               gamma: float) -> Tensor:
    """rows: [S] sequence ids; anchors: [S, M] anchor positions -> weighted cross-entropy."""
    bs = drafter.config.block_size
    offsets = torch.arange(bs)
    positions = anchors[..., None] + offsets  # [S, M, bs]
    tokens = data.tokens[rows]  # [S, T]
    block = torch.full_like(positions, drafter.config.mask_token_id)
    block[..., 0] = tokens.gather(1, anchors)  # slot 0: the real anchor token
    hidden = draft_blocks(drafter, target.embed(block.flatten(1)), data.features[rows],
                          anchors, positions.flatten(1))  # [S, M*bs, H]
    logits = target.logits(hidden.unflatten(1, (-1, bs))[:, :, 1:])  # [S, M, bs-1, V]
    labels = tokens.gather(1, positions[:, :, 1:].flatten(1)).view(logits.shape[:-1])
    weights = torch.exp(-(offsets[1:] - 1) / gamma)  # [bs-1]
    ce = F.cross_entropy(logits.flatten(0, 2), labels.flatten(), reduction="none")
    return (ce.view(labels.shape) * weights).sum() / (weights.sum() * labels[..., 0].numel())


def draft_blocks(drafter: Drafter, block_embeds: Tensor, features: Tensor, anchors: Tensor,
                 positions: Tensor) -> Tensor:
    """Every block of every sequence in one pass. block_embeds: [S, M*bs, H]; features:
    [S, T, F]; anchors: [S, M]; positions: [S, M*bs] -> normed hidden [S, M*bs, H]."""
    cfg = drafter.config.layers
    ctx = drafter.hidden_norm(drafter.fc(features))  # [S, T, H]
    ctx_pos = torch.arange(ctx.shape[1]).expand(ctx.shape[0], -1)
    rope_ctx = rope_tables(cfg.head_dim, cfg.rope_theta, ctx_pos)
    rope_block = rope_tables(cfg.head_dim, cfg.rope_theta, positions)
    mask = _block_mask(anchors, ctx.shape[1], drafter.config.block_size)[:, None]
    h = block_embeds
    for layer in drafter.layers:
        attn = layer.self_attn
        x = layer.input_layernorm(h)
        k_ctx, v_ctx = attn.project_kv(ctx, rope_ctx)  # [S, Hkv, T, D]
        k_blk, v_blk = attn.project_kv(x, rope_block)  # [S, Hkv, M*bs, D]
        out = F.scaled_dot_product_attention(
            attn.project_q(x, rope_block), torch.cat([k_ctx, k_blk], 2),
            torch.cat([v_ctx, v_blk], 2), attn_mask=mask, enable_gqa=True)
        h = h + attn.project_out(out)
        h = h + layer.mlp(layer.post_attention_layernorm(h))
    return drafter.norm(h)


def _block_mask(anchors: Tensor, context: int, bs: int) -> Tensor:
    """[S, M*bs, T + M*bs] bool: context before the block's anchor, and the block itself."""
    m = anchors.shape[1]
    sees_ctx = torch.arange(context) < anchors[..., None]  # [S, M, T]
    sees_ctx = sees_ctx.repeat_interleave(bs, dim=1)  # [S, M*bs, T]
    block_of = torch.arange(m).repeat_interleave(bs)  # [M*bs]
    same_block = (block_of[:, None] == block_of[None, :]).expand(anchors.shape[0], -1, -1)
    return torch.cat([sees_ctx, same_block], dim=-1)


def sample_anchors(data: DraftData, batch: int, per_seq: int, bs: int,
                   generator: torch.Generator) -> tuple[Tensor, Tensor]:
    """Random sequences and, in each, random anchors whose block stays inside the sequence."""
    rows = torch.randint(0, data.tokens.shape[0], (batch,), generator=generator)
    low, high = data.prompt_len, data.tokens.shape[1] - bs  # inclusive range of anchors
    anchors = low + torch.rand(batch, high - low + 1, generator=generator).argsort(-1)[:, :per_seq]
    return rows, anchors


def train_drafter(drafter: Drafter, target: Target, data: DraftData, schedule: Schedule,
                  per_seq: int, gamma: float, seed: int,
                  progress: Progress | None = None) -> list[float]:
    target.requires_grad_(False)  # shared embedding and LM head stay frozen
    bs = drafter.config.block_size

    def batch_loss(generator: torch.Generator) -> Tensor:
        rows, anchors = sample_anchors(data, schedule.batch, per_seq, bs, generator)
        return block_loss(drafter, target, data, rows, anchors, gamma)

    return fit(drafter, schedule, seed, progress, batch_loss)


def default_gamma(block_size: int) -> float:
    """The DFlash paper's loss decay: gamma 7 at block 16, 5 at 10, 4 at 8 (else block / 2)."""
    return {16: 7.0, 10: 5.0, 8: 4.0}.get(block_size, max(1.0, block_size / 2))
