"""Golden vLLM argv, written out by hand from notes/serving_engines.md §2 and §3.1."""

from __future__ import annotations

import json

import pytest

from backends.flags import LaunchTarget
from backends.flags import UnsupportedParams
from backends.flags import is_experimental
from backends.flags import render_command
from backends.flags import render_env
from backends.launch_params import LaunchParams

KIMI = "/models/Kimi-K2.6"
DRAFTER = "/models/Kimi-K2.6-DFlash"
TARGET = LaunchTarget(model_path=KIMI, drafter_path=DRAFTER, port=8000)
HOST_PORT = ["--host", "127.0.0.1", "--port", "8000"]


def test_tp8_dflash_block8_counts_draft_tokens_and_capture_sizes_in_tokens():
    params = LaunchParams(tp_size=8, speculative_algorithm="dflash",
                          speculative_dflash_block_size=8, max_running_requests=32,
                          cuda_graph_max_bs=32, mem_fraction_static=0.9)
    target = LaunchTarget(model_path=KIMI, drafter_path=DRAFTER, port=8000,
                          context_length=131072)
    argv = render_command("vllm", params, target, "0.33.0")
    assert argv == [
        "vllm", "serve", KIMI, "--trust-remote-code",
        "--tensor-parallel-size", "8",
        "--speculative-config",
        '{"method":"dflash","model":"/models/Kimi-K2.6-DFlash","num_speculative_tokens":7}',
        "--gpu-memory-utilization", "0.9", "--max-num-seqs", "32",
        "--max-model-len", "131072",
        # Batch sizes 1 2 4 8 16 24 32 times 8 tokens per request (7 drafts + anchor).
        "--compilation-config",
        '{"cudagraph_capture_sizes":[8,16,32,64,128,192,256],'
        '"cudagraph_mode":"FULL_AND_PIECEWISE"}',
        *HOST_PORT,
    ]
    assert render_env("vllm", params) == {}
    assert not is_experimental("vllm", params)


def test_block16_gives_fifteen_speculative_tokens():
    params = LaunchParams(speculative_algorithm="dflash", speculative_dflash_block_size=16,
                          max_running_requests=4, cuda_graph_bs_ladder="pow2")
    argv = render_command("vllm", params, TARGET)
    spec = json.loads(argv[argv.index("--speculative-config") + 1])
    graphs = json.loads(argv[argv.index("--compilation-config") + 1])
    assert spec == {"method": "dflash", "model": DRAFTER, "num_speculative_tokens": 15}
    assert graphs["cudagraph_capture_sizes"] == [16, 32, 64]


def test_tp8_without_speculation_captures_one_token_per_request():
    params = LaunchParams(tp_size=8, max_running_requests=16, cuda_graph_max_bs=16)
    argv = render_command("vllm", params, TARGET, "0.33.0")
    assert argv == [
        "vllm", "serve", KIMI, "--trust-remote-code", "--tensor-parallel-size", "8",
        "--gpu-memory-utilization", "0.88", "--max-num-seqs", "16",
        "--compilation-config",
        '{"cudagraph_capture_sizes":[1,2,4,8,16],"cudagraph_mode":"FULL_AND_PIECEWISE"}',
        *HOST_PORT,
    ]


def test_ep8_with_tp8_enables_expert_parallel():
    params = LaunchParams(tp_size=8, ep_size=8, cuda_graph=False)
    argv = render_command("vllm", params, TARGET, "0.33.0")
    assert argv == [
        "vllm", "serve", KIMI, "--trust-remote-code",
        "--tensor-parallel-size", "8", "--enable-expert-parallel",
        "--gpu-memory-utilization", "0.88", "--max-num-seqs", "48",
        "--enforce-eager",
        *HOST_PORT,
    ]


def test_ep4_with_tp8_is_unsupported():
    params = LaunchParams(tp_size=8, ep_size=4)
    with pytest.raises(UnsupportedParams, match="ep_size=4 with tp_size=8"):
        render_command("vllm", params, TARGET, "0.33.0")


def test_ep_with_dp_replicas_is_unsupported():
    # EP would have to span tp*dp = 8 GPUs, but ep_size must divide tp_size = 4.
    params = LaunchParams(tp_size=4, dp_size=2, ep_size=4)
    with pytest.raises(UnsupportedParams, match="spans tp\\*dp"):
        render_command("vllm", params, TARGET)


def test_dp_replicas_render_data_parallel_size():
    params = LaunchParams(tp_size=4, dp_size=2, cuda_graph=False)
    argv = render_command("vllm", params, TARGET)
    assert argv == [
        "vllm", "serve", KIMI, "--trust-remote-code",
        "--tensor-parallel-size", "4", "--data-parallel-size", "2",
        "--gpu-memory-utilization", "0.88", "--max-num-seqs", "48",
        "--enforce-eager",
        *HOST_PORT,
    ]


def test_ddtree_is_unsupported_and_points_to_sglang():
    params = LaunchParams(speculative_algorithm="ddtree")
    with pytest.raises(UnsupportedParams, match="SGLang|sglang.*DDTREE"):
        render_command("vllm", params, TARGET)
    assert is_experimental("vllm", params)


def test_attention_dp_is_unsupported():
    with pytest.raises(UnsupportedParams, match="enable_dp_attention"):
        render_command("vllm", LaunchParams(enable_dp_attention=True), TARGET)


def test_speculation_without_drafter_is_unsupported():
    params = LaunchParams(speculative_algorithm="dflash")
    with pytest.raises(UnsupportedParams, match="needs drafter_path"):
        render_command("vllm", params, LaunchTarget(model_path=KIMI))


@pytest.mark.parametrize("version", ["0.30.0", "0.31.2", "0.33", "0.33.7", "0.33.0rc1"])
def test_supported_versions(version):
    argv = render_command("vllm", LaunchParams(cuda_graph=False), TARGET, version)
    assert argv[:3] == ["vllm", "serve", KIMI]


@pytest.mark.parametrize("version", ["0.29.9", "0.34.0", "1.0.0"])
def test_unsupported_version_lists_ranges(version):
    with pytest.raises(ValueError, match=r"supported versions: 0\.30\.0-0\.33\.x"):
        render_command("vllm", LaunchParams(), TARGET, version)
