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
                          cuda_graph_max_bs=32, mem_fraction_static=0.9,
                          cudagraph_mode="PIECEWISE")
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
        '"cudagraph_mode":"PIECEWISE"}',
        *HOST_PORT,
    ]
    assert render_env("vllm", params) == {}
    assert not is_experimental("vllm", params)


def test_block16_gives_fifteen_speculative_tokens():
    params = LaunchParams(speculative_algorithm="dflash", speculative_dflash_block_size=16,
                          max_running_requests=4, cuda_graph_bs_ladder="pow2",
                          cudagraph_mode="PIECEWISE")
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


# --- vLLM's CPU build and launchers ------------------------------------------------------------


def test_the_cpu_build_gets_no_cuda_graph_flags_and_a_kv_cache_in_bytes():
    params = LaunchParams(tp_size=1, speculative_algorithm="dflash",
                          speculative_dflash_block_size=4, max_running_requests=4,
                          cuda_graph=True, mem_fraction_static=0.9)
    target = LaunchTarget(model_path="/pair/target", drafter_path="/pair/drafter", port=8000,
                          context_length=512, device="cpu", kv_cache_bytes=2**30)
    argv = render_command("vllm", params, target)
    assert argv == [
        "vllm", "serve", "/pair/target", "--trust-remote-code", "--tensor-parallel-size", "1",
        "--speculative-config",
        '{"method":"dflash","model":"/pair/drafter","num_speculative_tokens":3}',
        "--kv-cache-memory-bytes", "1073741824", "--max-num-seqs", "4",
        "--max-model-len", "512", *HOST_PORT,
    ]
    # Without a size the CPU build's own default holds; still no host-RAM fraction.
    bare = render_command("vllm", params, LaunchTarget("/m", device="cpu", drafter_path="/d"))
    assert not {"--gpu-memory-utilization", "--kv-cache-memory-bytes",
                "--compilation-config", "--enforce-eager"} & set(bare)


def test_a_launcher_replaces_vllm_serve_and_then_names_the_model_with_a_flag():
    launcher = ("/venv/bin/python", "-m", "vllm.entrypoints.openai.api_server")
    target = LaunchTarget(model_path=KIMI, port=8000, launcher=launcher)
    argv = render_command("vllm", LaunchParams(cuda_graph=False), target)
    assert argv[:5] == [*launcher, "--model", KIMI]
    assert "serve" not in argv
    # A wrapper that ends in `serve` keeps the positional model.
    wrapped = LaunchTarget(model_path=KIMI, launcher=("/opt/vllm/bin/vllm", "serve"))
    assert render_command("vllm", LaunchParams(cuda_graph=False), wrapped)[:3] == [
        "/opt/vllm/bin/vllm", "serve", KIMI]


def test_the_targets_environment_comes_with_the_command_and_wins():
    target = LaunchTarget(model_path=KIMI, env=(("LD_PRELOAD", "/v/lib/libiomp5.so"),))
    assert render_env("vllm", LaunchParams(), None, target) == {
        "LD_PRELOAD": "/v/lib/libiomp5.so"}


def test_an_unknown_device_is_refused():
    with pytest.raises(ValueError, match="device must be one of cuda, cpu"):
        LaunchTarget(model_path=KIMI, device="tpu")


def test_full_graphs_with_dflash_are_refused_for_wrong_logits():
    # vLLM PR #42728: FULL graphs gave wrong logits with DFlash at concurrency >= 2.
    params = LaunchParams(speculative_algorithm="dflash")
    with pytest.raises(UnsupportedParams, match="#42728.*PIECEWISE"):
        render_command("vllm", params, TARGET)
    eager = LaunchParams(speculative_algorithm="dflash", cuda_graph=False)
    assert "--enforce-eager" in render_command("vllm", eager, TARGET)
    plain = render_command("vllm", LaunchParams(max_running_requests=4), TARGET)
    assert '"cudagraph_mode":"FULL_AND_PIECEWISE"' in plain[plain.index("--compilation-config")
                                                            + 1]


def test_a_3_token_draft_at_128_requests_captures_512_tokens():
    params = LaunchParams(speculative_algorithm="dflash", speculative_dflash_block_size=4,
                          max_running_requests=128, cuda_graph_max_bs=128,
                          cudagraph_mode="PIECEWISE")
    argv = render_command("vllm", params, TARGET)
    graphs = json.loads(argv[argv.index("--compilation-config") + 1])
    assert max(graphs["cudagraph_capture_sizes"]) == 512


def test_cudagraph_mode_none_compiles_without_capture_sizes():
    argv = render_command("vllm", LaunchParams(cudagraph_mode="NONE"), TARGET)
    assert json.loads(argv[argv.index("--compilation-config") + 1]) == {"cudagraph_mode": "NONE"}
    assert "--enforce-eager" not in argv


def test_pcie_knobs_render_their_flags_and_environment():
    params = LaunchParams(tp_size=8, decode_context_parallel_size=2,
                          disable_custom_all_reduce=True, nccl_proto="LL", nccl_p2p_level="PHB",
                          cuda_graph=False)
    argv = render_command("vllm", params, TARGET)
    at = argv.index("--decode-context-parallel-size")
    assert argv[at + 1] == "2" and "--disable-custom-all-reduce" in argv
    assert render_env("vllm", params) == {"NCCL_PROTO": "LL", "NCCL_P2P_LEVEL": "PHB"}
    defaults = render_command("vllm", LaunchParams(cuda_graph=False), TARGET)
    assert not {"--decode-context-parallel-size", "--disable-custom-all-reduce"} & set(defaults)
