"""Checks launch commands with the engines' own code: SGLang 0.5.23 resolves and checks its
ServerArgs, vLLM 0.33 parses `vllm serve` and creates its engine config. Run by the python of
.venv-parsers (scripts/install_engine_parsers.sh); it imports nothing of dflash-tune.

stdin: a JSON list of {"engine": "sglang" | "vllm", "argv": [...], "env": {...}}, the argv
whole (launcher included). stdout: a JSON list, one entry a request:
{"accepted": bool, "error": str | None, "parsed": {what the engine read, or null}}.
All commands run in this one process: the imports take ~10 s, a command ~20 ms.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.machinery
import io
import json
import os
import sys
import types

# vLLM picks its platform at import: without a GPU it must be told the CPU, whose config
# creation then runs every parallelism and speculation check except the graph sizing.
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the checkpoints are local config.json dirs

SGLANG_HEAD = "sglang.launch_server"
VLLM_HEADS = ("serve", "vllm.entrypoints.openai.api_server")


def main() -> None:
    results = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # the engines log to stdout; only the results go there
    sys.stdout = sys.stderr
    requests = json.load(sys.stdin)
    with results:
        json.dump([check(r) for r in requests], results)


def check(request: dict) -> dict:
    saved = dict(os.environ)
    os.environ.update(request["env"])
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            parsed = CHECKS[request["engine"]](request["argv"])
        return {"accepted": True, "error": None, "parsed": parsed}
    except BaseException as error:  # argparse exits; the engines raise what they like
        return {"accepted": False, "error": _why(error, stderr.getvalue()), "parsed": None}
    finally:
        os.environ.clear()
        os.environ.update(saved)


def _why(error: BaseException, stderr: str) -> str:
    if isinstance(error, SystemExit):  # argparse printed usage, then "prog: error: ..."
        return next((line for line in reversed(stderr.splitlines()) if "error:" in line),
                    f"exit {error.code}")
    return f"{type(error).__name__}: {' '.join(str(error).split())}"


def _options(argv: list[str], heads: tuple[str, ...]) -> list[str]:
    """What follows the command that starts the engine (a launcher may come before it)."""
    ends = [i for i, arg in enumerate(argv) if arg in heads]
    if not ends:
        raise ValueError(f"no {' or '.join(heads)} in {argv}")
    return argv[ends[0] + 1:]


def check_sglang(argv: list[str]) -> dict:
    from sglang.srt.server_args import prepare_server_args

    # Our commands leave the device to SGLang, which finds CUDA on the node; here it would find
    # none and refuse DFLASH, so the node's answer is given.
    args = prepare_server_args([*_options(argv, (SGLANG_HEAD,)), "--device", "cuda"])
    args.resolve_once()
    args.check_server_args()
    r = args.resolved_dict()
    algorithm = r["speculative_algorithm"]
    return {
        "tp": r["tp_size"], "dp": r["dp_size"], "ep": r["ep_size"],
        "attn_dp": r["attn_dp_size"],
        "speculative": algorithm.lower() if algorithm else "none",
        "block": r["speculative_num_draft_tokens"] if algorithm else None,
        "custom_all_reduce_off": r["disable_custom_all_reduce"],
        "dcp": r["dcp_size"],
        "graph_mode": None,  # SGLang has no graph modes: graphs on or off
        "graph_sizes": r["cuda_graph_bs_decode"] or [],
        "max_running": r["max_running_requests"],
        "kv_cache": r["kv_cache_dtype"],
        "nccl": _nccl(),
    }


def check_vllm(argv: list[str]) -> dict:
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.entrypoints.cli.serve import ServeSubcommand
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser, serve = FlexibleArgumentParser(prog="vllm"), ServeSubcommand()
    serve.subparser_init(parser.add_subparsers(dest="subparser"))
    args = parser.parse_args(["serve", *_options(argv, VLLM_HEADS)])
    serve.validate(args)
    if args.model_tag is not None:  # `vllm serve MODEL`; the API server module takes --model
        args.model = args.model_tag
    engine = AsyncEngineArgs.from_cli_args(args)
    config = engine.create_engine_config()
    # The CPU platform turns graphs and the custom all-reduce off in the config it creates:
    # what the command asked for is read from the engine arguments.
    parallel, spec = config.parallel_config, config.speculative_config
    compile_ = engine.compilation_config
    return {
        "tp": parallel.tensor_parallel_size, "dp": parallel.data_parallel_size,
        # --enable-expert-parallel has no size: the MoE layers span every GPU of the launch.
        "ep": parallel.world_size_across_dp if parallel.enable_expert_parallel else 1,
        "attn_dp": 1,
        "speculative": spec.method if spec else "none",
        "block": spec.num_speculative_tokens + 1 if spec else None,  # vLLM counts no anchor
        "custom_all_reduce_off": engine.disable_custom_all_reduce,
        "dcp": parallel.decode_context_parallel_size,
        "graph_mode": "eager" if engine.enforce_eager else _mode(compile_),
        "graph_sizes": list(compile_.cudagraph_capture_sizes or []),
        "max_running": config.scheduler_config.max_num_seqs,
        "kv_cache": config.cache_config.cache_dtype,
        "nccl": _nccl(),
    }


def _mode(compilation) -> str | None:
    mode = compilation.cudagraph_mode
    return None if mode is None else mode.name


def _nccl() -> dict:
    """The NCCL variables the engine's processes would inherit."""
    return {k: v for k, v in os.environ.items() if k in ("NCCL_PROTO", "NCCL_P2P_LEVEL")}


class _NoTorchvision(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """SGLang's model configs import the vision models' image transforms at import time; no
    argument check uses them, and the registry's torchvision does not load beside a CPU torch.
    Empty stand-in modules let the import through (transformers is told first that there is
    no torchvision, so it never uses one)."""

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "torchvision":
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        module = types.ModuleType(spec.name)
        module.__getattr__ = _stand_in  # any name it imports
        return module

    def exec_module(self, module):
        module.__path__ = []


def _stand_in(name: str) -> type:
    if name.startswith("__"):
        raise AttributeError(name)
    return type(name, (), {})


def _without_torchvision() -> None:
    from transformers.utils import import_utils

    assert not import_utils.is_torchvision_available()  # decided (and cached) before the stand-in
    sys.meta_path.insert(0, _NoTorchvision())


CHECKS = {"sglang": check_sglang, "vllm": check_vllm}

if __name__ == "__main__":
    _without_torchvision()
    main()
