"""Which work of a decode step an engine runs on a second CUDA stream, beside the main one.

A MoE layer's shared expert reads the layer's input and joins the routed experts' output at
the end, so the engines run it on an auxiliary stream while the router, the routed experts
and their collectives run on the main stream:

- SGLang (the DeepSeek-V2/V3 code the Kimi K2 family runs, and its other MoE models with a
  shared expert): only inside a captured CUDA graph (an eager step runs it in sequence). Not
  where it folds the shared expert into the routed MoE kernel as one more expert, which it
  does for DeepSeek-V3's own layout: 256 routed experts, one shared, no expert parallelism,
  experts not 4-bit weight-only. Nor for a LatentMoE (Kimi-K3), whose first GEMM reads the
  shared expert's gate and up weights together with the router's and the latent
  down-projection's (its shared expert takes a stream of its own only beside an all-to-all
  expert dispatch, which no launch here selects).
- vLLM: on CUDA, eager or graphed, while the step has at most
  ``VLLM_SHARED_EXPERTS_STREAM_TOKEN_THRESHOLD`` tokens (256 by default).
- dflash_core's engine runs one stream.

Past 256 tokens a step the model credits the second stream with nothing, under either engine:
vLLM's developers measured no gain from it at larger batches (the routed experts fill the GPU,
and the shared expert's input is copied for the other stream), which is why vLLM stops using
it there; SGLang keeps it at every size but copies the input the same way.
"""

from __future__ import annotations

from backends.launch_params import LaunchParams
from backends.perf_model.catalog import ModelArch

__all__ = ["SHARED_STREAM_MAX_TOKENS", "shared_expert_beside_routed"]

SHARED_STREAM_MAX_TOKENS = 256
_SGLANG_FUSED_LAYOUT = ("DeepseekV3ForCausalLM", 256)  # (architecture, routed experts)


def shared_expert_beside_routed(engine: str, m: ModelArch, lp: LaunchParams, tokens: int,
                                use_graph: bool) -> bool:
    """Whether a step of ``tokens`` tokens under ``engine`` gains from the shared expert on a
    stream of its own, beside the routed experts: the engine runs it there, and the step is
    small enough to gain."""
    if not m.shared_expert_params or tokens > SHARED_STREAM_MAX_TOKENS:
        return False
    if engine.startswith("vllm"):
        return True
    if engine == "sglang":
        latent_moe = bool(m.expert_hidden) and m.expert_hidden != m.hidden
        return use_graph and not latent_moe and not _sglang_fuses_shared_expert(m, lp)
    return False


def _sglang_fuses_shared_expert(m: ModelArch, lp: LaunchParams) -> bool:
    """SGLang runs the shared expert as one more routed expert inside the MoE kernel."""
    weight_only_int4 = m.expert_weight_bits <= 4.5 and not m.expert_format
    return ((m.architecture, m.num_experts) == _SGLANG_FUSED_LAYOUT
            and m.shared_expert_params == m.expert_params
            and lp.ep_size == 1 and not weight_only_int4)
