"""The engine's commands: `generate`, `serve` and `fixtures build` (registered in tuner/cli.py).

Bodies stay thin; torch and the engine are imported inside them, so `dflash-tune run` and
`best` never load PyTorch.
"""

from __future__ import annotations

from enum import Enum
from pathlib import Path
from typing import Annotated

import typer

from tuner import render


class Method(str, Enum):
    none = "none"
    dflash = "dflash"
    ddtree = "ddtree"


def generate(
        target: Annotated[Path, typer.Option(help="Target checkpoint folder (HF Qwen3 layout).")],
        drafter: Annotated[Path | None, typer.Option(
            help="DFlash drafter checkpoint folder.")] = None,
        prompt: Annotated[list[str] | None, typer.Option(
            help="Prompt text (repeatable; needs tokenizer.json).")] = None,
        prompt_ids: Annotated[list[str] | None, typer.Option(
            help="Prompt token ids, e.g. '1,2,3' (repeatable).")] = None,
        method: Annotated[Method | None, typer.Option(
            help="Speculation method (default: dflash with a drafter, else none).")] = None,
        block_size: Annotated[int | None, typer.Option(
            help="Block size (default: the drafter's trained block).")] = None,
        budget: Annotated[int, typer.Option(help="DDTree node budget (root excluded).")] = 32,
        width: Annotated[int, typer.Option(help="DDTree candidates per depth (0 = all).")] = 0,
        depth: Annotated[int, typer.Option(help="DDTree max depth (0 = block - 1).")] = 0,
        spine: Annotated[bool, typer.Option(help="DDTree: greedy chain first.")] = False,
        max_tokens: Annotated[int, typer.Option(help="Tokens to generate per prompt.")] = 64,
        temperature: Annotated[float, typer.Option(help="0 = greedy.")] = 0.0,
        top_k: Annotated[int, typer.Option(help="0 = off.")] = 0,
        top_p: float = 1.0, seed: int = 0,
        device: Annotated[str, typer.Option(help="cpu, cuda, cuda:1, ...")] = "cpu",
        dtype: Annotated[str, typer.Option(help="float32, bfloat16 or float16.")] = "float32",
        compare: Annotated[bool, typer.Option(
            help="Also run plain decoding: speedup and token match in one run.")] = False,
) -> None:
    """Generate with the dflash_core engine and show tokens/s and the acceptance histogram."""
    from tuner.generate import GenerateRequest, run_generate

    chosen = method.value if method else ("dflash" if drafter else "none")
    req = GenerateRequest(target, drafter, prompt or [], prompt_ids or [], chosen, block_size,
                          budget, width, depth, spine,
                          dict(temperature=temperature, top_k=top_k, top_p=top_p,
                               max_tokens=max_tokens, seed=seed), device, dtype)
    report = run_generate(req, compare)
    _generate_tables(report)
    for text in report.texts:
        render.emit(text)


def _generate_tables(report) -> None:
    from dflash_core.stats import STAGES

    runs = report.runs.items()
    render.table("generate", ["method", "tokens", "tok/s", "rounds", "mean accept", "accepted"],
                 [(label, g.stats.generated_tokens, round(g.stats.tokens_per_s, 1), g.stats.rounds,
                   round(g.stats.mean_acceptance, 2),
                   " ".join(f"{k}:{n}" for k, n in sorted(g.stats.acceptance.items())))
                  for label, g in runs])
    render.table("stage time (ms)", ["method", *STAGES],
                 [(label, *(round(g.stats.stage_s[s] * 1e3, 1) for s in STAGES))
                  for label, g in runs])
    render.note("accepted = tokens per round (tau):request-rounds")
    if report.same_tokens is not None:
        first, plain = report.runs[next(iter(report.runs))], report.runs["none"]
        render.note(f"speedup over plain decoding: {plain.stats.wall_s / first.stats.wall_s:.2f}x;"
                    f" tokens identical: {report.same_tokens}")


def serve(
        target: Annotated[Path, typer.Option(help="Target checkpoint folder (with tokenizer.json).")],
        drafter: Annotated[Path | None, typer.Option(help="DFlash drafter folder.")] = None,
        method: Annotated[Method | None, typer.Option(
            help="Speculation (default: dflash with a drafter, else none).")] = None,
        block_size: Annotated[int | None, typer.Option(help="Default: the drafter's.")] = None,
        budget: Annotated[int, typer.Option(help="DDTree node budget.")] = 32,
        width: Annotated[int, typer.Option(help="DDTree candidates per depth (0 = budget).")] = 0,
        depth: Annotated[int, typer.Option(help="DDTree max depth (0 = block - 1).")] = 0,
        spine: Annotated[bool, typer.Option(help="DDTree: greedy chain first.")] = False,
        max_running_requests: Annotated[int, typer.Option(
            help="Rows of the engine's batch (continuous batching).")] = 8,
        max_context: Annotated[int, typer.Option(help="Prompt + output tokens per request.")]
        = 2048,
        cuda_graph_bs: Annotated[str, typer.Option(
            help="CUDA graph batch sizes, e.g. '1,2,4,8': rounds run padded to these sizes "
                 "and, on a CUDA device, replay captured graphs. Empty: eager.")]
        = "",
        host: str = "127.0.0.1", port: int = 8000,
        device: Annotated[str, typer.Option(help="cpu, cuda, cuda:1, ...")] = "cpu",
        dtype: Annotated[str, typer.Option(help="float32, bfloat16 or float16.")] = "float32",
        served_model_name: str | None = None, seed: int = 0) -> None:
    """Serve the dflash_core engine over an OpenAI-compatible HTTP API."""
    from tuner.generate import require_engine

    require_engine()
    from backends.dflash_server.launch import ServeOptions
    from backends.dflash_server.launch import serve as run_server

    chosen = method.value if method else ("dflash" if drafter else "none")
    graphs = [int(b) for b in cuda_graph_bs.replace(",", " ").split()]
    run_server(ServeOptions(target, drafter, chosen, block_size, budget, width, depth, spine,
                            max_running_requests, max_context, graphs, host, port, device, dtype,
                            served_model_name, seed))


def fixtures_build(
        out: Annotated[Path | None, typer.Option(
            help="Folder to build into (default: $DFLASH_TUNE_PAIR, else fixtures/tiny_code).")]
        = None,
        force: Annotated[bool, typer.Option(help="Rebuild even if the folder is complete.")]
        = False) -> None:
    """Build the pair from scratch (stdlib corpus, tokenizer, target, drafter; fixed seeds)."""
    from tuner.generate import require_engine

    require_engine()
    from dflash_core.training.build import build_pair
    from dflash_core.training.pair import default_pair_dir, is_complete

    folder = out or default_pair_dir()
    if is_complete(folder) and not force:
        render.note(f"{folder} is complete; --force rebuilds it")
    else:
        with render.stage_progress() as progress:
            manifest = build_pair(folder, progress=progress)
        render.table(f"built in {manifest['build_seconds']} s: mean acceptance on held-out "
                     "prompts (greedy)", ["configuration", "tau"],
                     sorted(manifest["acceptance"].items()))
    render.emit(str(folder))
