"""Shards of the DeepSeek-V3 / Kimi K2 MoE (what `shard_deepseek` puts in place of the full
modules; MLA itself needs none: its shard is the same module over fewer heads)."""

from __future__ import annotations

from torch import Tensor, nn

from dflash_core.models.deepseek_moe import DeepseekMoE, Router
from dflash_core.models.int4 import Int4Experts
from dflash_core.models.layers import MLP
from dflash_core.parallel.comm import Comm
from dflash_core.parallel.layout import Span
from dflash_core.parallel.modules import owned_pairs


class LocalInt4Experts(Int4Experts):
    """INT4 experts `span` of E over their `slice` of the intermediate dimension (whole
    quantisation groups: `Layout.check`): this rank's partial sum, as `modules.LocalExperts`."""

    def __init__(self, experts: Span, hidden: int, intermediate: Span, group: int) -> None:
        super().__init__(experts.count, hidden, intermediate.count, group)
        self.span, self.slice = experts, intermediate

    def forward(self, tokens: Tensor, weights: Tensor, experts: Tensor) -> Tensor:
        return super().forward(tokens, *owned_pairs(self.span, weights, experts))  # [T, H]


class ShardedDeepseekMoE(DeepseekMoE):
    """The replicated fp32 router, this rank's routed experts and its column / row slice of the
    shared experts; both give partial sums, so one all-reduce combines them (as the dense MLP's
    one), not one each."""

    def __init__(self, gate: Router, experts: nn.Module, shared: MLP | None,
                 comm: Comm) -> None:
        nn.Module.__init__(self)  # DeepseekMoE's would build the full experts
        self.gate, self.experts, self.shared_experts, self.comm = gate, experts, shared, comm

    def forward(self, x: Tensor) -> Tensor:
        return self.comm.all_reduce(super().forward(x))  # [B, N, H]
