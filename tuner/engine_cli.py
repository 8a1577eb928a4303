"""The engine's commands: `generate`, `serve`, `fixtures build` and `fixtures random`
(registered in tuner/cli.py).

Bodies stay thin and reach the engine through backends: `serve` is the server's own command
(`python -m backends.dflash_server`), and torch is imported inside the commands, so `dflash-tune
run` and `best` never load PyTorch. The launch's options are made from LaunchParams, as serve's
are (`backends.launch_cli`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from backends.dflash_server.cli import Compile
from backends.dflash_server.cli import Device
from backends.dflash_server.cli import Drafter
from backends.dflash_server.cli import Dtype
from backends.dflash_server.cli import option
from backends.dflash_server.cli import serve  # noqa: F401  (registered as `dflash-tune serve`)
from backends.launch_cli import ENGINE_DEFAULTS, ENGINE_DERIVED, launch_options
from backends.launch_params import SPECULATION_KNOBS
from tuner import render

# The batch is the prompts: no running cap, no capture sizes.
GENERATE_KNOBS = (*SPECULATION_KNOBS, "tp_size", "ep_size")


@launch_options(GENERATE_KNOBS, ENGINE_DEFAULTS, ENGINE_DERIVED)
def generate(
        target: Annotated[Path, option("target", "Target checkpoint folder (HF Qwen3 layout).")],
        drafter: Drafter = None,
        prompt: Annotated[list[str] | None, typer.Option(
            help="Prompt text (repeatable; needs tokenizer.json).")] = None,
        prompt_ids: Annotated[list[str] | None, typer.Option(
            help="Prompt token ids, e.g. '1,2,3' (repeatable).")] = None,
        max_tokens: Annotated[int, typer.Option(help="Tokens to generate per prompt.")] = 64,
        temperature: Annotated[float, typer.Option(help="0 = greedy.")] = 0.0,
        top_k: Annotated[int, typer.Option(help="0 = off.")] = 0,
        top_p: float = 1.0, seed: int = 0, device: Device = "cpu", dtype: Dtype = "float32",
        compare: Annotated[bool, typer.Option(
            help="Also run plain decoding: speedup and token match in one run.")] = False,
        stages: Annotated[bool, typer.Option(
            help="Time each stage of a round (a device sync per stage on a GPU).")] = False,
        compile: Compile = "none", *, launch: dict[str, Any]) -> None:
    """Generate with the dflash_core engine and show tokens/s and the acceptance histogram."""
    from backends.engine_builder import Checkpoints, EngineRuntime
    from backends.launch_cli import engine_launch
    from backends.local_engine import GenerateRequest, run_generate

    req = GenerateRequest(Checkpoints(target, drafter), engine_launch(launch, drafter),
                          EngineRuntime(device, dtype, compile), prompt or [], prompt_ids or [],
                          dict(temperature=temperature, top_k=top_k, top_p=top_p,
                               max_tokens=max_tokens, seed=seed), stages)
    report = run_generate(req, compare)
    _generate_tables(report)
    for text in report.texts:
        render.emit(text)
    if report.same_tokens is False:
        raise typer.Exit(1)


def _generate_tables(report) -> None:
    runs = report.runs.items()
    render.table("generate", ["method", "tokens", "tok/s", "rounds", "mean accept", "accepted"],
                 [(label, g.stats.generated_tokens, round(g.stats.tokens_per_s, 1), g.stats.rounds,
                   round(g.stats.mean_acceptance, 2),
                   " ".join(f"{k}:{n}" for k, n in sorted(g.stats.acceptance.items())))
                  for label, g in runs])
    if report.stages:
        render.table("stage time (ms)", ["method", *report.stages],
                     [(label, *(round(g.stats.stage_s[s] * 1e3, 1) for s in report.stages))
                      for label, g in runs])
    render.note("accepted = tokens per round (tau):request-rounds")
    if report.same_tokens is not None:
        first, plain = report.main, report.runs[report.reference]
        render.note(f"speedup over {report.reference}: "
                    f"{plain.stats.wall_s / first.stats.wall_s:.2f}x; tokens identical: "
                    f"{report.same_tokens}", "" if report.same_tokens else "red")
    traffic = report.main.stats.comm
    if traffic.calls:
        render.table("collectives per round (rank 0)", ["kind", "calls", "bytes"],
                     [(kind, round(calls, 1), round(nbytes)) for kind, (calls, nbytes)
                      in traffic.per_round(report.main.stats.rounds).items()])


def fixtures_build(
        out: Annotated[Path | None, typer.Option(
            help="Folder to build into (default: $DFLASH_TUNE_PAIR, else fixtures/tiny_code).")]
        = None,
        force: Annotated[bool, typer.Option(help="Rebuild even if the folder is complete.")]
        = False) -> None:
    """Build the pair from scratch (stdlib corpus, tokenizer, target, drafter; fixed seeds)."""
    from backends.local_engine import build_fixtures, fixtures_folder

    folder = fixtures_folder(out)
    try:
        with render.stage_progress() as progress:
            manifest = build_fixtures(folder, force, progress)
    except KeyboardInterrupt:
        render.note(f"interrupted: {folder} was not (re)built; run again to build it", "yellow")
        raise typer.Exit(130) from None
    if manifest is None:
        render.note(f"{folder} is complete; --force rebuilds it")
    else:
        render.table(f"built in {manifest['build_seconds']} s: mean acceptance on held-out "
                     "prompts (greedy)", ["configuration", "tau"],
                     sorted(manifest["acceptance"].items()))
    render.emit(str(folder))


def fixtures_random(
        arch: Annotated[str, typer.Option(help="Architecture: qwen3, qwen3-moe or deepseek-v3 "
                                               "(Kimi K2 shaped, INT4 experts, sharded).")],
        out: Annotated[Path, typer.Option(help="Folder to write target/ and drafter/ into.")],
        seed: Annotated[int, typer.Option(help="Seed of the random weights.")] = 0) -> None:
    """Write a random HF-layout target (with a tokenizer) and a matching random DFlash drafter:
    tiny, untrained (acceptance is noise), for smoke tests and for trying layouts. Prints a JSON
    manifest (arch, target, drafter, seed)."""
    from backends.local_engine import write_random_fixtures

    manifest = write_random_fixtures(arch, out, seed)
    render.note(f"random {arch} pair (seed {seed}) written to {out}: untrained, so drafts are "
                "rarely accepted")
    render.emit(json.dumps(manifest))
