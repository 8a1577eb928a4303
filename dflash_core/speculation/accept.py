"""The acceptance walk, vectorised: follow the target's own token from the root down the tree.

A node is accepted when its token equals the target's token at its parent, and so is every
ancestor's. Siblings hold distinct tokens, so the accepted nodes form one root path. Every
emitted token is the target's token (argmax or sample) given exactly the emitted prefix, which
is what makes the result lossless.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from dflash_core.speculation.tree import Tree


@dataclass(slots=True)
class Acceptance:
    path: Tensor  # [B, A] accepted node indices by depth; entries past `lengths` are 0
    lengths: Tensor  # [B] accepted nodes including the root (tau of the round)
    bonus: Tensor  # [B] the target's token after the path: the next anchor


def accept(tree: Tree, post: Tensor, path_len: int) -> Acceptance:
    """post: [B, N] target token per node; path_len: max depth + 1."""
    at_parent = post.gather(1, tree.parents.clamp_min(0))  # [B, N]
    match = (tree.tokens == at_parent) & tree.valid
    match[:, 0].fill_(True)  # fill_, not setitem: no scalar tensor made on the host
    accepted = ~(tree.mask & ~match[:, None, :]).any(-1) & tree.valid  # [B, N]
    depth = torch.where(accepted, tree.depths, -1)  # [B, N]
    deepest = depth.argmax(-1)  # [B]
    # Non-accepted nodes are scattered into a spare column that is dropped.
    column = torch.where(accepted, tree.depths, path_len)  # [B, N]
    nodes = torch.arange(tree.tokens.shape[1], device=post.device).expand_as(column)
    path = torch.zeros(column.shape[0], path_len + 1, dtype=torch.long, device=post.device)
    path = path.scatter(1, column, nodes)[:, :path_len]  # [B, A]
    bonus = post.gather(1, deepest[:, None])[:, 0]
    return Acceptance(path, depth.max(-1).values + 1, bonus)
