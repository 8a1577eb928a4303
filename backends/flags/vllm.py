"""vLLM launch flags, 0.30.0 to 0.33.x (read from the 0.33.0 wheel, notes §2).

Logical keys follow vLLM's own flag names: trust_remote_code, tensor_parallel_size,
data_parallel_size, enable_expert_parallel, decode_context_parallel_size,
disable_custom_all_reduce, speculative_config, gpu_memory_utilization, max_num_seqs,
max_model_len, compilation_config, enforce_eager, kv_cache_dtype, host, port. The model is the
positional argument of ``vllm serve`` and has no key. NCCL_PROTO and NCCL_P2P_LEVEL go in the
environment.
"""

from __future__ import annotations

from backends.flags._dialect import Argv
from backends.flags._dialect import EngineDialect
from backends.flags._dialect import FlagTable
from backends.flags._dialect import LaunchTarget
from backends.flags._dialect import UnsupportedParams
from backends.flags._dialect import compact_json
from backends.flags._dialect import fraction
from backends.flags._dialect import kv_cache_dtype
from backends.flags._dialect import nccl_env
from backends.flags._dialect import require_drafter
from backends.flags._versions import VersionRange
from backends.launch_params import LaunchParams

_FLAGS = {
    "trust_remote_code": "--trust-remote-code",
    "tensor_parallel_size": "--tensor-parallel-size",
    "data_parallel_size": "--data-parallel-size",
    "enable_expert_parallel": "--enable-expert-parallel",
    # Both in vLLM's engine arguments (notes §2.3; DCP's alias is -dcp). vLLM also turns its
    # custom all-reduce off by itself above 2 GPUs without full NVLink (RFC #56128).
    "decode_context_parallel_size": "--decode-context-parallel-size",
    "disable_custom_all_reduce": "--disable-custom-all-reduce",
    "speculative_config": "--speculative-config",
    "gpu_memory_utilization": "--gpu-memory-utilization",
    "max_num_seqs": "--max-num-seqs",
    "max_model_len": "--max-model-len",
    "compilation_config": "--compilation-config",
    "enforce_eager": "--enforce-eager",
    "host": "--host",
    "port": "--port",
    "model": "--model",  # launchers other than `vllm serve` take the model as an option
    "kv_cache_memory_bytes": "--kv-cache-memory-bytes",
    "kv_cache_dtype": "--kv-cache-dtype",
}

# A release whose FULL decode graphs verify DFlash correctly gets this feature (none yet).
FULL_GRAPHS_WITH_DFLASH = "full_graphs_with_dflash"
FULL_MODES = ("FULL_AND_PIECEWISE",)  # the tuned cudagraph_mode values that dispatch FULL graphs

# Older ranges go in front when someone checks their wheels.
TABLES = (FlagTable(VersionRange("0.30.0", "0.33.x"), _FLAGS),)


def render(params: LaunchParams, target: LaunchTarget, out: Argv) -> None:
    """Write ``vllm serve <model> ...`` for ``params`` into ``out``."""
    _check_supported(params, out.label)
    head = target.head("vllm", "serve")
    out.raw(*head)
    # Only `vllm serve` takes the model positionally; the API server module
    # (`python -m vllm.entrypoints.openai.api_server`) and its wrappers take --model.
    if head[-1] == "serve":
        out.raw(target.model_path)
    else:
        out.add("model", target.model_path)
    if target.trust_remote_code:
        out.add("trust_remote_code")
    out.add("tensor_parallel_size", params.tp_size)
    if params.dp_size > 1:
        out.add("data_parallel_size", params.dp_size)
    if params.ep_size > 1:
        out.add("enable_expert_parallel")
    if params.decode_context_parallel_size > 1:
        out.add("decode_context_parallel_size", params.decode_context_parallel_size)
    if params.disable_custom_all_reduce:
        out.add("disable_custom_all_reduce")
    if params.speculative:
        out.add("speculative_config", compact_json(_speculative_config(params, target, out)))
    _memory(params, target, out)
    kv_cache_dtype(params, out)
    out.add("max_num_seqs", params.max_running_requests)
    if target.context_length is not None:
        out.add("max_model_len", target.context_length)
    if target.device == "cuda":  # the CPU build captures no CUDA graphs; it compiles instead
        _cuda_graphs(params, out)
    out.add("host", target.host)
    out.add("port", target.port)


def render_env(params: LaunchParams, table: FlagTable) -> dict[str, str]:
    """Environment the launch needs for knobs that have no CLI flag: NCCL's."""
    return nccl_env(params)


def _check_supported(params: LaunchParams, label: str) -> None:
    if params.is_ddtree:
        raise UnsupportedParams(
            f"{label} has no DDTree (method 'ddtree' is rejected; upstream PR #42910 is open); "
            "use engine sglang, whose PR #29907 branch has --speculative-algorithm DDTREE"
        )
    if params.enable_dp_attention:
        raise UnsupportedParams(
            f"{label}: enable_dp_attention is not modelled for vLLM (with MoE its DP ranks "
            "already run attention DP); use dp_size"
        )
    # --enable-expert-parallel has no size: the MoE layers use EP over all tp*dp GPUs.
    if params.ep_size not in (1, params.gpus):
        raise UnsupportedParams(
            f"{label} expert parallelism spans tp*dp GPUs; ep_size={params.ep_size} with "
            f"tp_size={params.tp_size} and dp_size={params.dp_size} cannot be expressed"
        )


def _speculative_config(params: LaunchParams, target: LaunchTarget, out: Argv) -> dict:
    return {
        "method": "dflash",
        "model": require_drafter(params, target, out.label),
        # vLLM counts mask slots after the anchor: block 8 -> 7.
        "num_speculative_tokens": params.speculative_dflash_block_size - 1,
    }


def _memory(params: LaunchParams, target: LaunchTarget, out: Argv) -> None:
    if target.device == "cuda":
        out.add("gpu_memory_utilization", fraction(params.mem_fraction_static))
    # On CPU the fraction is of the host's RAM, and vLLM refuses to start when that much is not
    # free: a shared machine needs the KV cache sized in bytes (the fraction check then skips).
    elif target.kv_cache_bytes is not None:
        out.add("kv_cache_memory_bytes", target.kv_cache_bytes)


def _cuda_graphs(params: LaunchParams, out: Argv) -> None:
    if not params.cuda_graph:
        out.add("enforce_eager")
        return
    mode = params.cudagraph_mode
    if params.speculative and mode in FULL_MODES and FULL_GRAPHS_WITH_DFLASH not in out.features:
        # vLLM PR #42728: FULL graphs gave wrong target logits with DFlash at concurrency >= 2
        # (acceptance collapsed); PIECEWISE is the fix.
        raise UnsupportedParams(
            f"{out.label}: cudagraph_mode={mode} with DFlash gives wrong logits at concurrency "
            ">= 2 (vLLM PR #42728); use cudagraph_mode PIECEWISE or NONE"
        )
    config: dict = {"cudagraph_mode": mode}
    if mode != "NONE":
        # Capture sizes count tokens: a step of b requests verifies b * verify_tokens tokens, so
        # the largest size covers the running cap's whole verify (3-token drafts at 128
        # requests: 512), never vLLM's own default cap.
        config["cudagraph_capture_sizes"] = [b * params.verify_tokens
                                             for b in params.capture_batch_sizes]
    out.add("compilation_config", compact_json(config))


DIALECT = EngineDialect("vLLM", "0.33.0", TABLES, render, render_env, default_port=8000,
                        ddtree_note="DDTree is in no released vLLM (upstream PR #42910 is "
                        "open).")
