"""Which prefills each SGLang release replays as CUDA graphs (flags.graphed_prefill_tokens): the
rules read from each release's wheel, and the launch's own flags first."""

from __future__ import annotations

import math

import pytest

from backends.flags import PrefillModel, graphed_prefill_tokens
from backends.launch_params import LaunchParams

KIMI_K26 = PrefillModel("KimiK25ForConditionalGeneration", mla=True, linear_attention=False,
                        compute_capability=12.0)
KIMI_K3 = PrefillModel("KimiK3ForConditionalGeneration", mla=True, linear_attention=True,
                       compute_capability=10.3)
QWEN3 = PrefillModel("Qwen3ForCausalLM", mla=False, linear_attention=False,
                     compute_capability=10.0)
PLAIN = LaunchParams(tp_size=8, ep_size=8)


def _deepseek(capability: float) -> PrefillModel:
    return PrefillModel("DeepseekV3ForCausalLM", mla=True, linear_attention=False,
                        compute_capability=capability)


@pytest.mark.parametrize(("version", "tokens"), [
    ("0.5.11", 0), ("0.5.14", 0),  # piecewise graphs: no multimodal architecture
    ("0.5.15", 0),  # breakable graphs: no MLA model
    ("0.5.16", 2048), ("0.5.17", 2048),  # on the piecewise allowlist
    ("0.5.18", 2048), ("0.5.21", 2048), ("0.5.22", 2048),
    ("0.5.23", 8192),  # an MLA model's capture reaches 8,192 tokens
])
def test_kimi_k26_plain_launch_by_release(version, tokens):
    assert graphed_prefill_tokens("sglang", PLAIN, KIMI_K26, version) == tokens


def test_the_pinned_release_is_the_default():
    assert graphed_prefill_tokens("sglang", PLAIN, KIMI_K26) == 8192


def test_attention_dp_turns_off_piecewise_graphs_but_not_breakable_ones():
    dp = LaunchParams(tp_size=8, enable_dp_attention=True)
    assert graphed_prefill_tokens("sglang", dp, QWEN3, "0.5.13") == 0
    assert graphed_prefill_tokens("sglang", dp, KIMI_K26, "0.5.20") == 0  # piecewise there
    assert graphed_prefill_tokens("sglang", dp, KIMI_K26, "0.5.22") == 2048


def test_deepseek_v3_on_sm100_runs_trtllm_mla_without_prefill_graphs():
    assert graphed_prefill_tokens("sglang", PLAIN, _deepseek(10.0), "0.5.23") == 0
    assert graphed_prefill_tokens("sglang", PLAIN, _deepseek(9.0), "0.5.23") == 8192
    assert graphed_prefill_tokens("sglang", PLAIN, _deepseek(10.0), "0.5.13") == 2048


def test_kimi_k3_is_graphed_until_its_kda_layers_are_excluded():
    assert graphed_prefill_tokens("sglang", PLAIN, KIMI_K3, "0.5.18") == 2048
    assert graphed_prefill_tokens("sglang", PLAIN, KIMI_K3, "0.5.20") == 0


def test_a_dense_gqa_model_is_graphed_up_to_the_chunk_from_0_5_10():
    for version in ("0.5.10", "0.5.11", "0.5.15", "0.5.23"):
        assert graphed_prefill_tokens("sglang", PLAIN, QWEN3, version) == math.inf
    # Before, piecewise prefill graphs were opt-in.
    assert graphed_prefill_tokens("sglang", PLAIN, QWEN3, "0.5.8.post1") == 0


def test_the_launch_flags_come_first():
    eager = LaunchParams(tp_size=8, cuda_graph=False)
    dflash = LaunchParams(tp_size=8, speculative_algorithm="dflash",
                          speculative_dflash_block_size=8)
    for version in ("0.5.11", "0.5.23"):
        assert graphed_prefill_tokens("sglang", eager, QWEN3, version) == 0
    # From 0.5.14 a speculative launch turns prefill graphs off (SM120 crash, SGLang #35437);
    # before, its flags leave them on.
    assert graphed_prefill_tokens("sglang", dflash, QWEN3, "0.5.23") == 0
    assert graphed_prefill_tokens("sglang", dflash, QWEN3, "0.5.11") == math.inf


def test_other_engines_are_priced_without_prefill_graphs():
    assert graphed_prefill_tokens("vllm", PLAIN, QWEN3) == 0
    assert graphed_prefill_tokens("dflash", LaunchParams(), QWEN3) == 0
