"""The command lines we render, parsed by the engines' own argument parsers.

Skipped unless the engine is importable (`pip install -e '.[sglang]'` or `'.[vllm]'`; the engine
can be installed with --no-deps plus its light requirements on a CPU box, see
notes/serving_engines.md section 3.2). Parse-only: catches renamed, removed, ambiguous or
mistyped flags, not semantic conflicts.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from backends.flags import LaunchTarget, render_command
from backends.launch_params import LaunchParams

TARGET = LaunchTarget("/models/kimi", "/models/kimi-dflash", context_length=8192)
CONFIGS = {
    "tp8 graphs": LaunchParams(),
    "tp8 ep8 dflash eager": LaunchParams(ep_size=8, speculative_algorithm="dflash",
                                         cuda_graph=False),
    "tp4 dp2 dflash pow2": LaunchParams(tp_size=4, dp_size=2, speculative_algorithm="dflash",
                                        cuda_graph_bs_ladder="pow2"),
    "custom all-reduce off": LaunchParams(disable_custom_all_reduce=True, cuda_graph=False),
}
# vLLM runs DFlash with PIECEWISE graphs (its dialect refuses FULL ones, vLLM PR #42728), and
# takes decode context parallelism, which SGLang has no flag for.
VLLM_CONFIGS = {
    **{name: replace(lp, cudagraph_mode="PIECEWISE") if lp.speculative and lp.cuda_graph else lp
       for name, lp in CONFIGS.items()},
    "dcp2 graph mode none": LaunchParams(decode_context_parallel_size=2, cudagraph_mode="NONE"),
}


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_sglang_accepts_our_flags(name):
    server_args = pytest.importorskip("sglang.srt.server_args")
    argv = render_command("sglang", CONFIGS[name], TARGET)
    assert argv[:3] == ["python", "-m", "sglang.launch_server"]
    parsed = server_args.prepare_server_args(argv[3:])
    assert parsed.tp_size == CONFIGS[name].tp_size


@pytest.mark.parametrize("name", sorted(VLLM_CONFIGS))
def test_vllm_accepts_our_flags(name, monkeypatch):
    pytest.importorskip("vllm")
    monkeypatch.setenv("VLLM_TARGET_DEVICE", "cpu")  # else the device default cannot resolve
    cli_args = pytest.importorskip("vllm.entrypoints.common.cli_args")  # 0.33 layout
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    argv = render_command("vllm", VLLM_CONFIGS[name], TARGET)
    assert argv[:2] == ["vllm", "serve"]
    parser = cli_args.make_arg_parser(FlexibleArgumentParser())
    namespace = parser.parse_args(argv[2:])
    assert namespace.tensor_parallel_size == VLLM_CONFIGS[name].tp_size
