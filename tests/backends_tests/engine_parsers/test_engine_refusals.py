"""The engine rules our space and dialects refuse before a command is emitted, each next to
what the engine itself does with the command we would have printed. Where the released engine
accepts what we refuse, the test says so in its name: our rule stands on other evidence (a
crash, wrong output, a docs statement), not on the engine's parser."""

from __future__ import annotations

import json

import pytest
from emitted import REPO

from backends.flags import LaunchTarget
from backends.flags import UnsupportedParams
from backends.flags import is_experimental
from backends.flags import render_command
from backends.launch_params import InvalidParams
from backends.launch_params import LaunchParams
from search_spaces import load_space

pytestmark = pytest.mark.parsers

DFLASH = LaunchParams(speculative_algorithm="dflash")
VLLM_DFLASH = LaunchParams(speculative_algorithm="dflash", cudagraph_mode="PIECEWISE")
# The default study's space, as a real engine's study asks it.
SPACE = load_space("pcie8_kimi")
CONTEXT = {"gpus": 8, "num_experts": 384, "drafter_block_size": 8, "measured": True,
           "max_concurrency": 256, "engine": "sglang"}


@pytest.fixture(scope="module")
def target(checkpoints) -> LaunchTarget:
    return LaunchTarget(str(checkpoints[0]), str(checkpoints[1]), context_length=4096)


@pytest.fixture(scope="module")
def engine_says(probe, target):
    """The engine's verdict on each command below, all checked in one probe run."""
    commands = {name: make(target) for name, make in COMMANDS.items()}
    verdicts = probe([{"engine": engine, "argv": argv, "env": {}}
                      for engine, argv in commands.values()])
    return dict(zip(commands, verdicts))


def with_option(argv: list[str], flag: str, *values: str) -> list[str]:
    """``argv`` with ``flag``'s values replaced (or the flag added at the end)."""
    if flag not in argv:
        return [*argv, flag, *values]
    at = argv.index(flag)
    rest = next((i for i in range(at + 1, len(argv)) if argv[i].startswith("--")), len(argv))
    return [*argv[:at + 1], *values, *argv[rest:]]


def json_option(argv: list[str], flag: str, **changes) -> list[str]:
    value = json.loads(argv[argv.index(flag) + 1])
    return with_option(argv, flag, json.dumps({**value, **changes}))


def _sglang_dflash_with_dp_attention(target):
    """What our SGLang 0.5.23 dialect would print had it not refused: attention DP as it renders
    it (with the LM head split), plus its DFLASH flags."""
    argv = render_command("sglang", LaunchParams(enable_dp_attention=True), target)
    flags = render_command("sglang", DFLASH, target)
    at = flags.index("--speculative-algorithm")
    return "sglang", [*argv, *flags[at:at + 6]]


COMMANDS = {
    "sglang dflash + dp attention": _sglang_dflash_with_dp_attention,
    "sglang dflash + dp attention, no lm head split": lambda t: (
        "sglang", [a for a in _sglang_dflash_with_dp_attention(t)[1]
                   if a != "--enable-dp-lm-head"]),
    "sglang ddtree": lambda t: ("sglang", render_command(
        "sglang", LaunchParams(speculative_algorithm="ddtree"), t)),
    "sglang dcp": lambda t: ("sglang", with_option(
        render_command("sglang", LaunchParams(), t), "--decode-context-parallel-size", "2")),
    "sglang ep 3 of tp 8": lambda t: ("sglang", with_option(
        render_command("sglang", LaunchParams(ep_size=8), t), "--ep-size", "3")),
    "vllm ddtree": lambda t: ("vllm", json_option(
        render_command("vllm", VLLM_DFLASH, t), "--speculative-config", method="ddtree")),
    "vllm full graphs + dflash": lambda t: ("vllm", json_option(
        render_command("vllm", VLLM_DFLASH, t), "--compilation-config",
        cudagraph_mode="FULL_AND_PIECEWISE")),
    "vllm dcp 3 of tp 8": lambda t: ("vllm", with_option(
        render_command("vllm", LaunchParams(decode_context_parallel_size=2), t),
        "--decode-context-parallel-size", "3")),
}


def test_sglang_0_5_23_accepts_dflash_with_dp_attention_which_we_refuse(engine_says, target):
    """SGLang's docs (PR #23553) say DFLASH does not support DP attention; 0.5.23 resolves it
    (with --enable-dp-lm-head) but runs the draft without CUDA graphs. We keep refusing it."""
    launch = {"speculative_algorithm": "dflash", "enable_dp_attention": True}
    assert SPACE.violations({**launch, "tp_size": 8, "dp_size": 1}, CONTEXT)
    with pytest.raises(UnsupportedParams, match="dp_attention"):
        render_command("sglang", LaunchParams(**launch), target)
    verdict = engine_says["sglang dflash + dp attention"]
    assert verdict["accepted"], verdict["error"]
    assert (verdict["parsed"]["speculative"], verdict["parsed"]["attn_dp"]) == ("dflash", 8)


def test_sglang_refuses_dflash_with_dp_attention_without_the_lm_head_split(engine_says):
    verdict = engine_says["sglang dflash + dp attention, no lm head split"]
    assert not verdict["accepted"]
    assert "--enable-dp-lm-head" in verdict["error"]


def test_released_sglang_refuses_our_ddtree_commands_which_best_marks_experimental(engine_says):
    assert is_experimental("sglang", LaunchParams(speculative_algorithm="ddtree"))
    verdict = engine_says["sglang ddtree"]
    assert not verdict["accepted"]
    assert "DDTREE" in verdict["error"] or "ddtree" in verdict["error"]


def test_sglang_0_5_23_takes_decode_context_parallelism_which_our_dialect_refuses(
        engine_says, target):
    """SGLang 0.5.23 has decode context parallelism (--dcp-size, alias
    --decode-context-parallel-size); our SGLang dialect and space still ask it of vLLM only."""
    with pytest.raises(UnsupportedParams, match="decode_context_parallel_size"):
        render_command("sglang", LaunchParams(decode_context_parallel_size=2), target)
    verdict = engine_says["sglang dcp"]
    assert verdict["accepted"], verdict["error"]
    assert verdict["parsed"]["dcp"] == 2


def test_sglang_0_5_23_resolves_an_ep_size_not_dividing_tp_which_we_refuse(engine_says):
    """SGLang splits experts over ep_size ranks of the TP group (ep * moe_dp == tp); its
    argument checks do not catch an EP size that does not divide TP. We refuse it."""
    with pytest.raises(InvalidParams, match="ep_size 3 must divide tp_size 8"):
        LaunchParams(ep_size=3)
    verdict = engine_says["sglang ep 3 of tp 8"]
    assert verdict["accepted"], verdict["error"]
    assert verdict["parsed"]["ep"] == 3


def test_vllm_refuses_ddtree_as_our_dialect_does(engine_says, target):
    with pytest.raises(UnsupportedParams, match="no DDTree"):
        render_command("vllm", LaunchParams(speculative_algorithm="ddtree"), target)
    verdict = engine_says["vllm ddtree"]
    assert not verdict["accepted"]
    assert "ddtree" in verdict["error"]


def test_vllm_0_33_accepts_full_graphs_with_dflash_which_we_refuse(engine_says, target):
    """FULL graphs gave wrong target logits with DFlash at concurrency >= 2 (vLLM PR #42728);
    vLLM's config creation does not refuse them, our space and dialect do."""
    launch = {"speculative_algorithm": "dflash", "cuda_graph": True,
              "cudagraph_mode": "FULL_AND_PIECEWISE"}
    assert SPACE.violations(launch, {**CONTEXT, "engine": "vllm"})
    with pytest.raises(UnsupportedParams, match="PR #42728"):
        render_command("vllm", LaunchParams(**launch), target)
    verdict = engine_says["vllm full graphs + dflash"]
    assert verdict["accepted"], verdict["error"]
    assert verdict["parsed"]["graph_mode"] == "FULL_AND_PIECEWISE"


def test_vllm_refuses_a_dcp_size_not_dividing_tp_as_we_do(engine_says):
    assert SPACE.violations({"tp_size": 8, "decode_context_parallel_size": 3},
                            {**CONTEXT, "engine": "vllm"})
    with pytest.raises(InvalidParams, match="decode_context_parallel_size 3 must divide"):
        LaunchParams(decode_context_parallel_size=3)
    verdict = engine_says["vllm dcp 3 of tp 8"]
    assert not verdict["accepted"]
    assert "divisible by dcp_size=3" in verdict["error"]
