"""Every command `best --emit-flags` can print (emitted.py), checked by the engine it is for:
SGLang 0.5.23 and vLLM 0.33.0 accept it and read in it what we meant."""

from __future__ import annotations

import pytest
from emitted import ENGINES
from emitted import Emitted
from emitted import emitted

from backends.launch_params import LaunchParams

pytestmark = pytest.mark.parsers

# Each engine's commands must reach every choice of these knobs (our SGLang dialect renders no
# decode context parallelism or graph modes; vLLM's expert parallelism spans every GPU, and we
# give it no attention DP).
COVERED = {
    "sglang": {"tp_size": {4, 8}, "ep_size": {1, 4, 8}, "enable_dp_attention": {False, True}},
    "vllm": {"tp_size": {4, 8}, "ep_size": {1, 8}, "decode_context_parallel_size": {1, 2, 4, 8},
             "cudagraph_mode": {"FULL_AND_PIECEWISE", "PIECEWISE", "NONE"}},
}
BOTH = {"disable_custom_all_reduce": {False, True}, "nccl_proto": {None, "LL", "LL128", "Simple"},
        "nccl_p2p_level": {None, "LOC", "SYS"}, "speculative_algorithm": {"none", "dflash"},
        "speculative_dflash_block_size": set(range(2, 9)), "cuda_graph": {True, False},
        "kv_cache_dtype": {"auto", "fp8_e4m3"}}


@pytest.fixture(scope="module")
def commands(checkpoints) -> list[Emitted]:
    """Those for released engines (DDTree's are for SGLang's branch: test_engine_refusals)."""
    return [c for c in emitted(*checkpoints) if not c.experimental]


@pytest.fixture(scope="module")
def verdicts(commands, probe) -> list[tuple[Emitted, dict]]:
    return list(zip(commands, probe([c.request() for c in commands])))


@pytest.mark.parametrize("engine", ENGINES)
def test_the_commands_reach_every_choice_of_every_knob(commands, engine):
    for knob, choices in {**BOTH, **COVERED[engine]}.items():
        seen = {getattr(c.launch, knob) for c in commands if c.engine == engine}
        assert choices <= seen, f"{engine} {knob}: {sorted(choices - seen, key=str)} never emitted"


@pytest.mark.parametrize("engine", ENGINES)
def test_the_engine_accepts_every_command(verdicts, engine):
    refused = [f"{c.study}: {' '.join(c.argv)}\n  -> {v['error']}"
               for c, v in verdicts if c.engine == engine and not v["accepted"]]
    assert not refused, f"{len(refused)} refused, e.g.\n" + "\n".join(refused[:5])


@pytest.mark.parametrize("engine", ENGINES)
def test_the_engine_reads_what_we_meant(verdicts, engine):
    wrong = [f"{c.study}: {' '.join(c.argv)}\n  {_differences(meaning(c), v['parsed'])}"
             for c, v in verdicts if c.engine == engine and v["accepted"]
             and v["parsed"] != meaning(c)]
    assert not wrong, f"{len(wrong)} read otherwise, e.g.\n" + "\n".join(wrong[:5])


def meaning(command: Emitted) -> dict:
    """What ``command`` asks of its engine, in engine_probe.py's terms."""
    lp = command.launch
    asked = {
        "tp": lp.tp_size, "dp": lp.dp_size, "ep": lp.ep_size,
        "attn_dp": lp.tp_size if lp.enable_dp_attention else 1,
        "speculative": lp.speculative_algorithm,
        "block": lp.speculative_dflash_block_size if lp.speculative else None,
        "custom_all_reduce_off": lp.disable_custom_all_reduce,
        "dcp": lp.decode_context_parallel_size,
        "max_running": lp.max_running_requests,
        "kv_cache": lp.kv_cache_dtype,
        "nccl": {k: v for k, v in (("NCCL_PROTO", lp.nccl_proto),
                                   ("NCCL_P2P_LEVEL", lp.nccl_p2p_level)) if v is not None},
    }
    if command.engine == "vllm":
        return {**asked, **_vllm_graphs(lp, command.device)}
    # SGLang captures a graph per batch of requests and has no graph modes.
    return {**asked, "graph_mode": None, "graph_sizes": list(lp.capture_batch_sizes)}


def _vllm_graphs(lp: LaunchParams, device: str) -> dict:
    if device == "cpu":  # the CPU build compiles and captures nothing: no graph flags
        return {"graph_mode": None, "graph_sizes": []}
    if not lp.cuda_graph:
        return {"graph_mode": "eager", "graph_sizes": []}
    # vLLM captures per token: b requests verify b x the verify width tokens a step.
    sizes = [b * lp.verify_tokens for b in lp.capture_batch_sizes]
    return {"graph_mode": lp.cudagraph_mode,
            "graph_sizes": [] if lp.cudagraph_mode == "NONE" else sizes}


def _differences(ours: dict, theirs: dict) -> str:
    return ", ".join(f"{k}: ours {ours[k]!r}, engine {theirs.get(k)!r}"
                     for k in ours if ours[k] != theirs.get(k))
