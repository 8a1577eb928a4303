"""A fake SGLang or vLLM: takes the engine's own launch command, refuses what a node of
``--gpus`` GPUs would refuse, and otherwise serves openai_stub with that engine's metrics.

    python fake_engine.py --gpus N python -m sglang.launch_server --model-path M ... --port P
    python fake_engine.py --gpus N vllm serve M --tensor-parallel-size 2 ... --port P
    python fake_engine.py --gpus N --tokens-per-s 100 ...   (a slower stream than the default)

The command is parsed strictly, as the engines' argparse does (an unknown flag exits 2), so a
ServerBackend test also checks the argv its dialect renders. Failures, as the engines log them:
more GPUs than the node has -> ``ValueError`` (invalid configuration); a memory fraction above
``OOM_FRACTION`` -> ``torch.OutOfMemoryError``. Speculative launches commit ``ACCEPT_LEN``
tokens per verify round (at most the block), counted as the engine counts them in ``/metrics``.

The fake node is a PCIe box without peer-to-peer access, where the all-reduce path decides the
speed (the published measurements on 8x RTX PRO 6000): the engine's custom all-reduce is slow,
NCCL is ``NCCL_OVER_CUSTOM`` times faster, and NCCL's LL128 protocol another ``LL128_OVER_NCCL``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

OOM_FRACTION = 0.95  # weights plus the KV pool at 0.99 of the card: what a real launch OOMs at
ACCEPT_LEN = 3
STUB_TIMING = {"ttft_ms": 5.0, "tokens_per_s": 1000.0}  # fast: contract tests launch often
ENGINES = {("python", "-m", "sglang.launch_server"): "sglang", ("vllm", "serve"): "vllm"}
NCCL_OVER_CUSTOM = 1.3
LL128_OVER_NCCL = 1.4


def _sglang_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser("sglang.launch_server", allow_abbrev=False)
    parser.add_argument("--model-path", required=True)
    for flag in ("--tp-size", "--dp-size", "--ep-size", "--attn-dp-size",
                 "--max-running-requests", "--context-length", "--speculative-num-draft-tokens",
                 "--speculative-ddtree-budget", "--cuda-graph-max-bs-decode"):
        parser.add_argument(flag, type=int, default=1)
    for flag in ("--trust-remote-code", "--enable-dp-lm-head", "--disable-custom-all-reduce"):
        parser.add_argument(flag, action="store_true")
    parser.add_argument("--speculative-algorithm", choices=("DFLASH", "DDTREE"))
    parser.add_argument("--speculative-draft-model-path")
    parser.add_argument("--mem-fraction-static", type=float, default=0.88)
    parser.add_argument("--cuda-graph-bs-decode", type=int, nargs="+")
    for flag in ("--cuda-graph-backend-decode", "--cuda-graph-backend-prefill"):
        parser.add_argument(flag, choices=("disabled",))
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=30000)
    return parser


def _vllm_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser("vllm serve", allow_abbrev=False)
    parser.add_argument("model")
    for flag in ("--tensor-parallel-size", "--data-parallel-size", "--max-num-seqs",
                 "--max-model-len", "--decode-context-parallel-size"):
        parser.add_argument(flag, type=int, default=1)
    for flag in ("--trust-remote-code", "--enable-expert-parallel", "--enforce-eager",
                 "--disable-custom-all-reduce"):
        parser.add_argument(flag, action="store_true")
    parser.add_argument("--speculative-config", type=json.loads)
    parser.add_argument("--compilation-config", type=json.loads)
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    return parser


def _launch(engine: str, args: argparse.Namespace) -> tuple[int, float, int | None]:
    """-> (GPUs the launch spans, memory fraction, speculative block or None)."""
    if engine == "sglang":
        block = args.speculative_num_draft_tokens if args.speculative_algorithm else None
        return args.tp_size * args.dp_size, args.mem_fraction_static, block
    spec = args.speculative_config
    block = spec["num_speculative_tokens"] + 1 if spec else None
    return (args.tensor_parallel_size * args.data_parallel_size, args.gpu_memory_utilization,
            block)


def _refuse(gpus: int, world: int, memory: float) -> None:
    if world > gpus:
        sys.exit(f"ValueError: the launch spans {world} GPUs but only {gpus} are available "
                 "on this node")
    if memory > OOM_FRACTION:
        print("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 "
              f"has a total capacity of 95.00 GiB (mem fraction {memory:g})", flush=True)
        sys.exit(1)


def _metrics(engine: str, speculative: bool):
    """``/metrics`` as ``engine`` names it: requests running and waiting, and acceptance."""
    import openai_stub
    from starlette.responses import PlainTextResponse

    state = openai_stub.STATE

    def lines() -> list[str]:
        emitted, rounds = sum(state.emitted.values()), sum(state.rounds.values())
        labels = f'{{model_name="{state.config.model}"}}'
        if engine == "sglang":
            busy = {"sglang:num_running_reqs": state.in_flight, "sglang:num_queue_reqs": 0}
            # A gauge over the last logged interval; 0 until the first speculative round.
            spec = {"sglang:spec_accept_length": emitted / rounds if rounds else 0.0}
        else:
            busy = {"vllm:num_requests_running": state.in_flight,
                    "vllm:num_requests_waiting": 0}
            # vLLM counts drafts (one per round) and accepted draft tokens (bonus excluded).
            spec = {"vllm:spec_decode_num_drafts_total": rounds,
                    "vllm:spec_decode_num_accepted_tokens_total": emitted - rounds}
        samples = {**busy, **(spec if speculative else {})}
        return [f"{name}{labels} {float(value)}" for name, value in samples.items()]

    async def metrics(request):
        return PlainTextResponse("\n".join(lines()) + "\n")

    return metrics


def _all_reduce_speedup(args: argparse.Namespace) -> float:
    """Stream speed relative to the engine's defaults: NCCL carries the all-reduce only with
    the custom one disabled, and its protocol matters only then."""
    if not args.disable_custom_all_reduce:
        return 1.0
    return NCCL_OVER_CUSTOM * (LL128_OVER_NCCL if os.environ.get("NCCL_PROTO") == "LL128" else 1)


def _serve(engine: str, args: argparse.Namespace, block: int | None,
           tokens_per_s: float) -> None:
    import openai_stub
    import uvicorn
    from starlette.applications import Starlette
    from starlette.routing import Route

    model = args.model_path if engine == "sglang" else args.model
    accept = min(ACCEPT_LEN, block) if block else 1
    openai_stub.STATE.config = openai_stub.Config(
        model=model, accept_len=accept, ttft_ms=STUB_TIMING["ttft_ms"],
        tokens_per_s=tokens_per_s * _all_reduce_speedup(args))
    routes = [r for r in openai_stub.app.routes if r.path != "/metrics"]
    routes += [Route("/metrics", _metrics(engine, block is not None)),
               Route("/health_generate", openai_stub.health)]
    print(f"fake {engine} serving {model} on {args.host}:{args.port}", flush=True)
    uvicorn.run(Starlette(routes=routes), host=args.host, port=args.port, log_level="warning",
                access_log=False)


def main() -> None:
    own = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    own.add_argument("--gpus", type=int, required=True)
    own.add_argument("--tokens-per-s", type=float, default=STUB_TIMING["tokens_per_s"])
    own.add_argument("command", nargs=argparse.REMAINDER)
    ours = own.parse_args()
    engine = next((name for prefix, name in ENGINES.items()
                   if tuple(ours.command[:len(prefix)]) == prefix), None)
    if engine is None:
        own.error(f"not an sglang or vllm launch: {ours.command[:3]}")
    parser = _sglang_parser() if engine == "sglang" else _vllm_parser()
    args = parser.parse_args(ours.command[3 if engine == "sglang" else 2:])
    world, memory, block = _launch(engine, args)
    _refuse(ours.gpus, world, memory)
    _serve(engine, args, block, ours.tokens_per_s)


if __name__ == "__main__":
    main()
