"""Engine-independent behaviour of backends.flags: registry, quoting, overrides, errors."""

from __future__ import annotations

import shlex

import pytest

from backends.flags import DEFAULT_VERSIONS
from backends.flags import ENGINES
from backends.flags import LaunchTarget
from backends.flags import UnsupportedParams
from backends.flags import is_experimental
from backends.flags import render_command
from backends.flags import render_env
from backends.flags import render_shell
from backends.launch_params import InvalidParams
from backends.launch_params import LaunchParams

ODD_PATH = "/models/Kimi K2.6 'int4\""
DRAFTER = "/models/draft dir"
GRAPHS_OFF = LaunchParams(tp_size=8, cuda_graph=False)
SMALL_GRAPHS = LaunchParams(tp_size=8, max_running_requests=4)


def test_registry_names_and_pinned_versions():
    assert ENGINES == ("sglang", "vllm", "dflash")
    assert DEFAULT_VERSIONS == {"sglang": "0.5.23", "vllm": "0.33.0", "dflash": "0.1.0"}


def test_unsupported_params_is_an_invalid_params_value_error():
    assert issubclass(UnsupportedParams, InvalidParams)
    assert issubclass(UnsupportedParams, ValueError)


@pytest.mark.parametrize("engine", ENGINES)
def test_path_with_space_and_quotes_stays_one_argument_and_round_trips(engine):
    tp = 1 if engine == "dflash" else 8  # our server runs on one device
    params = LaunchParams(tp_size=tp, speculative_algorithm="dflash", max_running_requests=4,
                          cuda_graph=engine != "vllm")  # vLLM: no FULL graphs with DFlash
    target = LaunchTarget(model_path=ODD_PATH, drafter_path=DRAFTER)
    argv = render_command(engine, params, target)
    assert ODD_PATH in argv
    assert shlex.split(render_shell(argv)) == argv


def test_sglang_rendered_shell_line_quotes_the_path():
    argv = render_command("sglang", GRAPHS_OFF, LaunchTarget(model_path=ODD_PATH), "0.5.12")
    assert render_shell(argv) == (
        "python -m sglang.launch_server --model-path '/models/Kimi K2.6 '\"'\"'int4\"' "
        "--trust-remote-code --tp-size 8 --mem-fraction-static 0.88 --max-running-requests 48 "
        "--disable-cuda-graph --disable-piecewise-cuda-graph --host 127.0.0.1 --port 30000"
    )


def test_extra_args_are_appended_verbatim():
    target = LaunchTarget(model_path="/m", extra_args=("--enable-metrics", "--page-size", "1"))
    argv = render_command("sglang", GRAPHS_OFF, target, "0.5.12")
    assert argv[-5:] == ["--port", "30000", "--enable-metrics", "--page-size", "1"]


def test_override_renames_a_flag():
    overrides = {"cuda_graph_max_bs": "--cuda-graph-max-bs"}
    argv = render_command("sglang", SMALL_GRAPHS, LaunchTarget(model_path="/m"), "0.5.23",
                          overrides)
    assert argv == [
        "python", "-m", "sglang.launch_server", "--model-path", "/m", "--trust-remote-code",
        "--tp-size", "8", "--mem-fraction-static", "0.88", "--max-running-requests", "4",
        "--cuda-graph-max-bs", "4", "--cuda-graph-bs-decode", "1", "2", "4",
        "--host", "127.0.0.1", "--port", "30000",
    ]


def test_override_to_none_drops_the_flag_and_its_values():
    overrides = {"cuda_graph_bs": None, "trust_remote_code": None}
    argv = render_command("sglang", SMALL_GRAPHS, LaunchTarget(model_path="/m"), "0.5.23",
                          overrides)
    assert argv == [
        "python", "-m", "sglang.launch_server", "--model-path", "/m",
        "--tp-size", "8", "--mem-fraction-static", "0.88", "--max-running-requests", "4",
        "--cuda-graph-max-bs-decode", "4",
        "--host", "127.0.0.1", "--port", "30000",
    ]


def test_vllm_override_renames_and_drops():
    overrides = {"tensor_parallel_size": "-tp", "enforce_eager": None}
    argv = render_command("vllm", GRAPHS_OFF, LaunchTarget(model_path="/m"), None, overrides)
    assert argv == [
        "vllm", "serve", "/m", "--trust-remote-code", "-tp", "8",
        "--gpu-memory-utilization", "0.88", "--max-num-seqs", "48",
        "--host", "127.0.0.1", "--port", "30000",
    ]


def test_override_of_a_key_from_another_version_is_accepted_and_unused():
    target = LaunchTarget(model_path="/m")
    plain = render_command("sglang", GRAPHS_OFF, target, "0.5.23")
    assert render_command("sglang", GRAPHS_OFF, target, "0.5.23",
                          {"disable_cuda_graph": "--no-graphs"}) == plain


def test_unknown_override_key_lists_known_keys():
    expected = "cuda_graph_max_bs_decode.*known keys:.*cuda_graph_max_bs,"
    with pytest.raises(ValueError, match=expected):
        render_command("sglang", GRAPHS_OFF, LaunchTarget(model_path="/m"),
                       flag_overrides={"cuda_graph_max_bs_decode": "--x"})


def test_override_must_look_like_a_flag():
    with pytest.raises(ValueError, match="cuda_graph_max_bs"):
        render_command("sglang", GRAPHS_OFF, LaunchTarget(model_path="/m"),
                       flag_overrides={"cuda_graph_max_bs": "cuda-graph-max-bs"})


def test_unknown_engine_is_value_error_listing_engines():
    target = LaunchTarget(model_path="/m")
    with pytest.raises(ValueError, match="known engines: sglang, vllm"):
        render_command("trtllm", GRAPHS_OFF, target)
    with pytest.raises(ValueError, match="trtllm"):
        render_env("trtllm", GRAPHS_OFF)
    with pytest.raises(ValueError, match="trtllm"):
        is_experimental("trtllm", GRAPHS_OFF)


def test_params_no_engine_accepts_are_invalid_params():
    with pytest.raises(InvalidParams, match="ep_size 3 must divide tp_size 8"):
        render_command("sglang", LaunchParams(tp_size=8, ep_size=3), LaunchTarget(model_path="/m"))


def test_render_env_checks_the_version():
    with pytest.raises(ValueError, match="0.5.11-0.5.13"):
        render_env("sglang", GRAPHS_OFF, "0.4.0")


@pytest.mark.parametrize("engine", ["sglang", "vllm"])
def test_an_8_bit_kv_cache_is_one_flag_both_engines_spell_alike(engine):
    for dtype in ("fp8_e4m3", "fp8_e5m2"):
        argv = render_command(engine, LaunchParams(kv_cache_dtype=dtype), LaunchTarget("/m"))
        assert argv[argv.index("--kv-cache-dtype") + 1] == dtype
    assert "--kv-cache-dtype" not in render_command(engine, LaunchParams(), LaunchTarget("/m"))
