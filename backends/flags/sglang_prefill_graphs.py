"""Which prefill forwards an SGLang release runs as CUDA graphs, for a model and a launch.

On CUDA GPUs SGLang captures prefill forwards in CUDA graphs unless told not to from 0.5.10
(before, only with --enable-piecewise-cuda-graph): 0.5.10-0.5.14 with torch.compile's
piecewise graphs, from 0.5.15 with breakable graphs. Both break at each layer's attention,
which runs eagerly between two replayed segments. Each release turns them off for some models
and launches. The rules below were read from each release's wheel (``server_args.py``;
``arg_groups/cuda_graph_hook.py`` and ``memory_hook.py`` from 0.5.20) for the conditions this
project's models and launches can meet:

- 0.5.6-0.5.9: off (opt-in).
- 0.5.10-0.5.14 (piecewise): off for multimodal architectures and under attention DP.
- 0.5.15: breakable, off for MLA models.
- 0.5.16-0.5.17: breakable, off for MLA models and for multimodal ones not on its breakable
  allowlist; a multimodal architecture on its piecewise allowlist (Kimi-K2.5's) runs piecewise
  graphs instead (off under attention DP).
- 0.5.18-0.5.23: breakable; off for DeepSeek-V3's architecture on SM100 GPUs, where it defaults
  to the trtllm_mla backend (a captured prefill forces a slower attention fallback there), for
  Kimi Delta Attention hybrids from 0.5.20, and for multimodal architectures off both
  allowlists; Kimi-K2.5's is on the piecewise one in 0.5.20-0.5.21 and on the breakable one
  otherwise, Kimi-K3's on the breakable one in 0.5.18-0.5.19.
- An MLA model captures prefill forwards of up to 2,048 tokens until 0.5.22, 8,192 in 0.5.23;
  others up to the prefill chunk. A longer forward runs eagerly.

Decode context parallelism, pipeline parallelism and expert all-to-all backends also turn them
off in some releases; this dialect renders none of them. The launch's own flags come first:
an eager launch, and a speculative one from 0.5.14 (``sglang.prefill_graphs_off``), run every
prefill eagerly.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from backends.flags._dialect import PrefillModel
from backends.flags._versions import VersionRange, parse_version
from backends.launch_params import LaunchParams

_KIMI_K25 = "KimiK25ForConditionalGeneration"
_KIMI_K3 = "KimiK3ForConditionalGeneration"
_DEEPSEEK_V3 = "DeepseekV3ForCausalLM"
_ANY = None  # every architecture


@dataclass(slots=True, frozen=True)
class _Rules:
    versions: VersionRange
    # Architectures the release runs with piecewise graphs (off under attention DP).
    piecewise: frozenset[str] | None
    # Multimodal architectures the release captures at all (None: every architecture).
    multimodal: frozenset[str] | None
    off_for_mla: bool = False
    off_for_deepseek_v3_on_sm100: bool = False
    off_for_linear_attention: bool = False
    mla_max_tokens: float = 2048
    by_default: bool = True  # False: only when asked for (no flag of this dialect does)


_RULES = (
    _Rules(VersionRange("0.5.6", "0.5.9"), piecewise=_ANY, multimodal=_ANY, by_default=False),
    _Rules(VersionRange("0.5.10", "0.5.14"), piecewise=_ANY, multimodal=frozenset()),
    _Rules(VersionRange("0.5.15", "0.5.15"), piecewise=frozenset(), multimodal=_ANY,
           off_for_mla=True),
    _Rules(VersionRange("0.5.16", "0.5.17"), piecewise=frozenset({_KIMI_K25}),
           multimodal=frozenset({_KIMI_K25}), off_for_mla=True),
    _Rules(VersionRange("0.5.18", "0.5.19"), piecewise=frozenset(),
           multimodal=frozenset({_KIMI_K25, _KIMI_K3}), off_for_deepseek_v3_on_sm100=True),
    _Rules(VersionRange("0.5.20", "0.5.21"), piecewise=frozenset({_KIMI_K25}),
           multimodal=frozenset({_KIMI_K25, _KIMI_K3}), off_for_deepseek_v3_on_sm100=True,
           off_for_linear_attention=True),
    _Rules(VersionRange("0.5.22", "0.5.22"), piecewise=frozenset(),
           multimodal=frozenset({_KIMI_K25, _KIMI_K3}), off_for_deepseek_v3_on_sm100=True,
           off_for_linear_attention=True),
    _Rules(VersionRange("0.5.23", "0.5.23"), piecewise=frozenset(),
           multimodal=frozenset({_KIMI_K25, _KIMI_K3}), off_for_deepseek_v3_on_sm100=True,
           off_for_linear_attention=True, mla_max_tokens=8192),
)


def _listed(archs: frozenset[str] | None, architecture: str) -> bool:
    return archs is None or architecture in archs


def graphed_prefill_tokens(params: LaunchParams, version: str, model: PrefillModel) -> float:
    """The most tokens a prefill forward of ``model`` holds and still replays as CUDA graphs,
    when SGLang ``version`` serves it with ``params`` (0: every prefill runs eagerly; inf: any
    forward up to the prefill chunk)."""
    parsed = parse_version(version)
    rules = next(r for r in _RULES if parsed in r.versions)
    if not rules.by_default:
        return 0
    arch = model.architecture
    # SGLang's multimodal architectures are the ones named "...ForConditionalGeneration".
    if arch.endswith("ForConditionalGeneration") and not _listed(rules.multimodal, arch):
        return 0
    if _listed(rules.piecewise, arch):
        if params.enable_dp_attention:
            return 0
    elif rules.off_for_mla and model.mla:
        return 0
    if rules.off_for_linear_attention and model.linear_attention:
        return 0
    if (rules.off_for_deepseek_v3_on_sm100 and arch == _DEEPSEEK_V3
            and 10 <= model.compute_capability < 11):
        return 0
    return rules.mla_max_tokens if model.mla else math.inf
