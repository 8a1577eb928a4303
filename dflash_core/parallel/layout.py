"""Which slice of a model each rank holds: tensor parallelism over `tp` ranks, experts over `ep`.

The layout is SGLang's `--tp N --ep M`: N ranks in all; attention, dense MLPs, the embedding and
the LM head split N ways; the routed experts split into M groups of N / M ranks, each group
holding E / M experts whose intermediate dimension its N / M ranks split again (expert-internal
TP). `--tp 2 --ep 2` is therefore pure EP for the experts, `--tp 4 --ep 2` mixes both.
"""

from __future__ import annotations

from dataclasses import dataclass

from dflash_core.models.architectures import TargetConfig
from dflash_core.models.config import CheckpointError
from dflash_core.models.deepseek_config import DeepseekConfig


@dataclass(slots=True, frozen=True)
class Span:
    """Indices [start, start + count) of one dimension."""

    start: int
    count: int

    @property
    def stop(self) -> int:
        return self.start + self.count


@dataclass(slots=True, frozen=True)
class Layout:
    tp: int = 1
    ep: int = 1

    def __post_init__(self) -> None:
        if min(self.tp, self.ep) < 1 or self.tp % self.ep:
            raise ValueError(f"need tp >= 1 and ep dividing tp, got tp={self.tp} ep={self.ep}")

    @property
    def world(self) -> int:
        return self.tp

    @property
    def moe_tp(self) -> int:
        """Ranks that split each expert's intermediate dimension."""
        return self.tp // self.ep

    def check(self, cfg: TargetConfig) -> None:
        """A CheckpointError naming the first dimension this layout cannot split evenly."""
        for name, size, parts in self._needs(cfg):
            if size % parts:
                raise CheckpointError(f"{name} {size} does not split over {parts} ranks")
        if isinstance(cfg, DeepseekConfig):
            self._check_int4_groups(cfg)
            return
        kv, tp = cfg.num_key_value_heads, self.tp
        if kv % tp and tp % kv:
            raise CheckpointError(f"num_key_value_heads {kv} and tp {tp}: one must divide "
                                  "the other")

    def _needs(self, cfg: TargetConfig) -> list[tuple[str, int, int]]:
        """(dimension, size, ways it is split) for every dimension this layout splits."""
        tp = self.tp
        needs = [("num_attention_heads", cfg.num_attention_heads, tp),
                 ("intermediate_size", cfg.intermediate_size, tp),
                 ("vocab_size", cfg.vocab_size, tp)]
        if cfg.num_experts:
            needs += [("num_experts", cfg.num_experts, self.ep),
                      ("moe_intermediate_size", cfg.moe_intermediate_size, self.moe_tp)]
        if isinstance(cfg, DeepseekConfig) and cfg.n_shared_experts:
            shared = "shared experts' intermediate (n_shared_experts x moe_intermediate_size)"
            needs.append((shared, cfg.shared_intermediate_size, tp))
        return needs

    def _check_int4_groups(self, cfg: DeepseekConfig) -> None:
        """INT4 down_proj weights are packed and scaled along the intermediate dimension: each
        rank's slice of it must be whole quantisation groups."""
        if cfg.quantization is None or not cfg.num_experts:
            return
        group, inner = cfg.quantization.group_size, cfg.moe_intermediate_size // self.moe_tp
        if inner % group:
            raise CheckpointError(f"moe_intermediate_size {cfg.moe_intermediate_size} over "
                                  f"{self.moe_tp} ranks leaves {inner} per rank, not a multiple "
                                  f"of the INT4 group_size {group}: use a larger ep")

    def q_heads(self, cfg: TargetConfig, rank: int) -> Span:
        count = cfg.num_attention_heads // self.tp
        return Span(rank * count, count)

    def kv_heads(self, cfg: TargetConfig, rank: int) -> Span:
        """This rank's KV heads; with fewer KV heads than ranks, the one its query heads read
        (replicated on tp / kv ranks)."""
        kv = cfg.num_key_value_heads
        if kv >= self.tp:
            count = kv // self.tp
            return Span(rank * count, count)
        group = cfg.num_attention_heads // kv  # query heads per KV head
        return Span(self.q_heads(cfg, rank).start // group, 1)

    def split(self, size: int, rank: int) -> Span:
        """An even tp-way split of `size` (intermediate, vocabulary)."""
        count = size // self.tp
        return Span(rank * count, count)

    def experts(self, cfg: TargetConfig, rank: int) -> Span:
        count = cfg.num_experts // self.ep
        return Span(rank // self.moe_tp * count, count)

    def expert_intermediate(self, cfg: TargetConfig, rank: int) -> Span:
        count = cfg.moe_intermediate_size // self.moe_tp
        return Span(rank % self.moe_tp * count, count)
