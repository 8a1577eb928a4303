"""Golden SGLang argv, written out by hand from notes/serving_engines.md §1 and §3.1."""

from __future__ import annotations

import shlex

import pytest

from backends.flags import LaunchTarget
from backends.flags import UnsupportedParams
from backends.flags import is_experimental
from backends.flags import render_command
from backends.flags import render_env
from backends.flags import rounds_overlapped
from backends.launch_params import LaunchParams

KIMI = "/models/Kimi-K2.6"
DRAFTER = "/models/Kimi-K2.6-DFlash"
TARGET = LaunchTarget(model_path=KIMI, drafter_path=DRAFTER)
LAUNCH = ["python", "-m", "sglang.launch_server", "--model-path", KIMI, "--trust-remote-code"]
HOST_PORT = ["--host", "127.0.0.1", "--port", "30000"]
DFLASH_TP8_EP8 = LaunchParams(
    tp_size=8, ep_size=8, speculative_algorithm="dflash", speculative_dflash_block_size=8,
    max_running_requests=32, cuda_graph_max_bs=32, cuda_graph_bs_ladder="pow2",
)


def test_tp8_without_speculation_captures_dense_ladder():
    argv = render_command("sglang", LaunchParams(tp_size=8), TARGET, "0.5.23")
    assert argv == [
        *LAUNCH, "--tp-size", "8",
        "--mem-fraction-static", "0.88", "--max-running-requests", "48",
        "--cuda-graph-max-bs-decode", "32",
        "--cuda-graph-bs-decode", "1", "2", "4", "8", "16", "24", "32",
        *HOST_PORT,
    ]


def test_tp8_ep8_dflash_block8_at_0_5_23():
    target = LaunchTarget(model_path=KIMI, drafter_path=DRAFTER, context_length=131072)
    argv = render_command("sglang", DFLASH_TP8_EP8, target, "0.5.23")
    assert argv == [
        *LAUNCH, "--tp-size", "8", "--ep-size", "8",
        "--speculative-algorithm", "DFLASH",
        "--speculative-draft-model-path", DRAFTER,
        "--speculative-num-draft-tokens", "8",
        "--mem-fraction-static", "0.88", "--max-running-requests", "32",
        "--cuda-graph-max-bs-decode", "32",
        "--cuda-graph-bs-decode", "1", "2", "4", "8", "16", "32",
        "--cuda-graph-backend-prefill", "disabled",
        "--context-length", "131072",
        *HOST_PORT,
    ]
    assert render_env("sglang", DFLASH_TP8_EP8, "0.5.23") == {}
    assert not is_experimental("sglang", DFLASH_TP8_EP8)


def test_tp8_ep8_dflash_agrees_with_the_notes_recipe():
    # §3.1 "SGLang, TP8" plus "--ep-size 8"; flags this package does not model are dropped.
    # The decode graph sizes and the prefill graphs off (SGLang #35437) are ours, cut below.
    recipe = shlex.split(
        "python -m sglang.launch_server --model-path /models/Kimi-K2.6 --trust-remote-code "
        "--tp-size 8 --ep-size 8 --speculative-algorithm DFLASH "
        "--speculative-draft-model-path /models/Kimi-K2.6-DFlash "
        "--speculative-num-draft-tokens 8 --mem-fraction-static 0.88 --max-running-requests 32 "
        "--cuda-graph-max-bs-decode 32 --context-length 131072 --host 127.0.0.1 --port 30000"
    )
    target = LaunchTarget(model_path=KIMI, drafter_path=DRAFTER, context_length=131072)
    argv = render_command("sglang", DFLASH_TP8_EP8, target)  # default version is 0.5.23
    at = argv.index("--cuda-graph-bs-decode")
    assert argv[at + 7:at + 9] == ["--cuda-graph-backend-prefill", "disabled"]
    assert argv[:at] + argv[at + 9:] == recipe


def test_tp8_ep8_dflash_at_0_5_12_uses_old_graph_flags():
    argv = render_command("sglang", DFLASH_TP8_EP8, TARGET, "0.5.12")
    assert argv == [
        *LAUNCH, "--tp-size", "8", "--ep-size", "8",
        "--speculative-algorithm", "DFLASH",
        "--speculative-draft-model-path", DRAFTER,
        "--speculative-num-draft-tokens", "8",
        "--mem-fraction-static", "0.88", "--max-running-requests", "32",
        "--cuda-graph-max-bs", "32", "--cuda-graph-bs", "1", "2", "4", "8", "16", "32",
        *HOST_PORT,
    ]


def test_graphs_off_at_0_5_12_disables_decode_and_piecewise_prefill_graphs():
    # 0.5.12's --disable-cuda-graph leaves its piecewise prefill graphs on.
    params = LaunchParams(tp_size=8, cuda_graph=False, mem_fraction_static=0.9)
    argv = render_command("sglang", params, TARGET, "0.5.12")
    assert argv == [
        *LAUNCH, "--tp-size", "8",
        "--mem-fraction-static", "0.9", "--max-running-requests", "48",
        "--disable-cuda-graph", "--disable-piecewise-cuda-graph",
        *HOST_PORT,
    ]


def test_graphs_off_at_0_5_23_disables_both_phase_backends():
    params = LaunchParams(tp_size=4, cuda_graph=False)
    argv = render_command("sglang", params, TARGET, "0.5.23")
    assert argv == [
        *LAUNCH, "--tp-size", "4",
        "--mem-fraction-static", "0.88", "--max-running-requests", "48",
        "--cuda-graph-backend-decode", "disabled", "--cuda-graph-backend-prefill", "disabled",
        *HOST_PORT,
    ]


def test_0_5_16_uses_the_per_phase_graph_names():
    params = LaunchParams(tp_size=8, max_running_requests=4)
    argv = render_command("sglang", params, TARGET, "0.5.16")
    assert argv == [
        *LAUNCH, "--tp-size", "8",
        "--mem-fraction-static", "0.88", "--max-running-requests", "4",
        "--cuda-graph-max-bs-decode", "4", "--cuda-graph-bs-decode", "1", "2", "4",
        *HOST_PORT,
    ]


def test_ddtree_budget16_renders_pr_branch_flags_and_topk_env():
    params = LaunchParams(
        tp_size=8, speculative_algorithm="ddtree", speculative_dflash_block_size=8,
        speculative_ddtree_budget=16, speculative_ddtree_topk=4, speculative_ddtree_max_depth=7,
        max_running_requests=16, cuda_graph_max_bs=16,
    )
    argv = render_command("sglang", params, TARGET, "0.5.23")
    assert argv == [
        *LAUNCH, "--tp-size", "8",
        "--speculative-algorithm", "DDTREE",
        "--speculative-draft-model-path", DRAFTER,
        "--speculative-num-draft-tokens", "8",
        "--speculative-ddtree-budget", "16",
        "--mem-fraction-static", "0.88", "--max-running-requests", "16",
        "--cuda-graph-max-bs-decode", "16", "--cuda-graph-bs-decode", "1", "2", "4", "8", "16",
        "--cuda-graph-backend-prefill", "disabled",
        *HOST_PORT,
    ]
    assert render_env("sglang", params, "0.5.23") == {"SGLANG_DDTREE_MAX_TOPK": "4"}
    assert is_experimental("sglang", params)


def test_ddtree_depth_below_draft_length_is_unsupported():
    params = LaunchParams(speculative_algorithm="ddtree", speculative_dflash_block_size=8,
                          speculative_ddtree_max_depth=5)
    with pytest.raises(UnsupportedParams, match="speculative_ddtree_max_depth=5"):
        render_command("sglang", params, TARGET)


def test_a_ddtree_round_cap_is_unsupported():
    params = LaunchParams(speculative_algorithm="ddtree", speculative_dflash_block_size=8,
                          speculative_ddtree_round_tokens=64)
    with pytest.raises(UnsupportedParams, match="speculative_ddtree_round_tokens=64"):
        render_command("sglang", params, TARGET)


def test_attention_dp_at_0_5_23_uses_attn_dp_size_and_dp_lm_head():
    params = LaunchParams(tp_size=8, enable_dp_attention=True, cuda_graph=False)
    argv = render_command("sglang", params, TARGET, "0.5.23")
    assert argv == [
        *LAUNCH, "--tp-size", "8", "--attn-dp-size", "8", "--enable-dp-lm-head",
        "--mem-fraction-static", "0.88", "--max-running-requests", "48",
        "--cuda-graph-backend-decode", "disabled", "--cuda-graph-backend-prefill", "disabled",
        *HOST_PORT,
    ]


def test_attention_dp_at_0_5_21_uses_enable_dp_attention_with_dp_size():
    params = LaunchParams(tp_size=8, enable_dp_attention=True, cuda_graph=False)
    argv = render_command("sglang", params, TARGET, "0.5.21")
    assert argv == [
        *LAUNCH, "--tp-size", "8", "--enable-dp-attention", "--dp-size", "8",
        "--mem-fraction-static", "0.88", "--max-running-requests", "48",
        "--cuda-graph-backend-decode", "disabled", "--cuda-graph-backend-prefill", "disabled",
        *HOST_PORT,
    ]


@pytest.mark.parametrize("algorithm", ["dflash", "ddtree"])
@pytest.mark.parametrize("version", ["0.5.12", "0.5.21", "0.5.22", "0.5.23"])
def test_speculation_with_attention_dp_is_unsupported_in_every_version(algorithm, version):
    # SGLang docs PR #23553: DFLASH does not support DP attention (0.5.23 parses it, with the
    # draft's graphs off).
    params = LaunchParams(tp_size=8, enable_dp_attention=True, speculative_algorithm=algorithm)
    with pytest.raises(UnsupportedParams, match="enable_dp_attention.*#23553"):
        render_command("sglang", params, TARGET, version)


def test_dflash_turns_prefill_graphs_off_where_the_phase_has_a_backend():
    # SGLang #35437: DFLASH prefill-graph capture crashes; the decode graphs stay.
    dflash = LaunchParams(speculative_algorithm="dflash", max_running_requests=4)
    for version in ("0.5.14", "0.5.23"):
        argv = render_command("sglang", dflash, TARGET, version)
        at = argv.index("--cuda-graph-backend-prefill")
        assert argv[at + 1] == "disabled" and "--cuda-graph-max-bs-decode" in argv
        assert "--cuda-graph-backend-prefill" not in render_command(
            "sglang", LaunchParams(max_running_requests=4), TARGET, version)
    assert "--cuda-graph-backend-prefill" not in render_command("sglang", dflash, TARGET,
                                                                "0.5.12")


def test_custom_all_reduce_off_renders_its_flag_in_every_version():
    params = LaunchParams(disable_custom_all_reduce=True, cuda_graph=False)
    for version in ("0.5.11", "0.5.23"):
        argv = render_command("sglang", params, TARGET, version)
        assert argv.count("--disable-custom-all-reduce") == 1
    assert "--disable-custom-all-reduce" not in render_command("sglang", LaunchParams(), TARGET)


def test_nccl_knobs_go_in_the_environment():
    params = LaunchParams(nccl_proto="LL128", nccl_p2p_level="LOC")
    assert render_env("sglang", params) == {"NCCL_PROTO": "LL128", "NCCL_P2P_LEVEL": "LOC"}
    assert render_env("sglang", LaunchParams()) == {}
    assert not any(a.startswith("NCCL") for a in render_command("sglang", params, TARGET))


@pytest.mark.parametrize("knob", [{"decode_context_parallel_size": 2},
                                  {"cudagraph_mode": "PIECEWISE"}])
def test_vllm_only_knobs_are_refused_by_name(knob):
    with pytest.raises(UnsupportedParams, match=f"cannot express {next(iter(knob))}="):
        render_command("sglang", LaunchParams(**knob), TARGET)


def test_replicas_with_legacy_attention_dp_are_unsupported():
    params = LaunchParams(tp_size=4, dp_size=2, enable_dp_attention=True)
    with pytest.raises(UnsupportedParams, match="dp_size=2"):
        render_command("sglang", params, TARGET, "0.5.21")


def test_dp_replicas_render_dp_size():
    params = LaunchParams(tp_size=4, dp_size=2, cuda_graph=False, mem_fraction_static=0.91234)
    argv = render_command("sglang", params, TARGET, "0.5.23")
    assert argv == [
        *LAUNCH, "--tp-size", "4", "--dp-size", "2",
        "--mem-fraction-static", "0.912", "--max-running-requests", "48",
        "--cuda-graph-backend-decode", "disabled", "--cuda-graph-backend-prefill", "disabled",
        *HOST_PORT,
    ]


def test_speculation_without_drafter_is_unsupported():
    params = LaunchParams(speculative_algorithm="dflash")
    with pytest.raises(UnsupportedParams, match="needs drafter_path"):
        render_command("sglang", params, LaunchTarget(model_path=KIMI))


def test_no_trust_remote_code_and_custom_host_port():
    target = LaunchTarget(model_path=KIMI, host="0.0.0.0", port=31000, trust_remote_code=False)
    argv = render_command("sglang", LaunchParams(tp_size=1, cuda_graph=False), target, "0.5.11")
    assert argv == [
        "python", "-m", "sglang.launch_server", "--model-path", KIMI, "--tp-size", "1",
        "--mem-fraction-static", "0.88", "--max-running-requests", "48",
        "--disable-cuda-graph", "--disable-piecewise-cuda-graph",
        "--host", "0.0.0.0", "--port", "31000",
    ]


@pytest.mark.parametrize("version", ["0.5.5", "0.5.24", "0.6.0"])
def test_unsupported_version_lists_ranges(version):
    ranges = (r"0\.5\.6-0\.5\.9, 0\.5\.10, 0\.5\.11-0\.5\.13, 0\.5\.14-0\.5\.21, "
              r"0\.5\.22, 0\.5\.23")
    with pytest.raises(ValueError, match=ranges):
        render_command("sglang", LaunchParams(), TARGET, version)


@pytest.mark.parametrize("version", ["0.5.8.post1", "0.5.10"])
def test_releases_before_dflash_serve_plain_launches_only(version):
    argv = render_command("sglang", LaunchParams(tp_size=8), TARGET, version)
    assert argv[argv.index("--tp-size") + 1] == "8"
    dflash = LaunchParams(tp_size=8, speculative_algorithm="dflash")
    with pytest.raises(UnsupportedParams, match="no DFLASH"):
        render_command("sglang", dflash, TARGET, version)


def test_eager_before_0_5_10_needs_no_prefill_flag():
    # Piecewise prefill graphs are opt-in there.
    argv = render_command("sglang", LaunchParams(tp_size=8, cuda_graph=False), TARGET, "0.5.9")
    assert "--disable-cuda-graph" in argv
    assert "--disable-piecewise-cuda-graph" not in argv


@pytest.mark.parametrize("version", ["latest", "", "0.5.x", "five"])
def test_unparsable_version_is_value_error(version):
    with pytest.raises(ValueError, match="version"):
        render_command("sglang", LaunchParams(), TARGET, version)


def test_post_release_uses_its_base_version_table():
    params = LaunchParams(cuda_graph=False)
    assert (render_command("sglang", params, TARGET, "0.5.12.post1")
            == render_command("sglang", params, TARGET, "0.5.12"))


@pytest.mark.parametrize("version, overlapped", [("0.5.11", False), ("0.5.13", False),
                                                 ("0.5.14", True), ("0.5.23", True),
                                                 (None, True)])
def test_dflash_rounds_overlap_the_scheduler_from_the_spec_v2_worker(version, overlapped):
    dflash = LaunchParams(speculative_algorithm="dflash")
    assert rounds_overlapped("sglang", dflash, version) is overlapped


@pytest.mark.parametrize("engine, algorithm", [("sglang", "ddtree"), ("sglang", "none"),
                                               ("vllm", "dflash"), ("dflash", "dflash")])
def test_only_sglang_dflash_rounds_overlap(engine, algorithm):
    assert not rounds_overlapped(engine, LaunchParams(speculative_algorithm=algorithm))
