"""Multi-rank engines for the parallel tests: ranks on the CPU (gloo), one thread each.

Each `Ranks` starts its followers once (seconds on 2 cores), so a test module keeps one per
layout and runs every check on it."""

from __future__ import annotations

import functools
from pathlib import Path

import torch

from dflash_core import AcceptanceProfile, OracleProposer, SamplingParams, Spec, build_engine
from dflash_core import load_models
from dflash_core.models.random_checkpoint import write_random_pair
from dflash_core.parallel.layout import Layout
from dflash_core.parallel.ranks import EngineRecipe, Ranks

SHIPPED = Path(__file__).resolve().parents[2] / "fixtures" / "tiny_code"
# Mixed lengths, so rows commit at different offsets.
PROMPTS = [[1, 2, 3, 4, 5, 6, 7], [9, 10], [11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21], [30]]
ENGINE = dict(max_batch=4, max_context=64, max_tree_nodes=20)
GREEDY = SamplingParams(max_tokens=14)


def random_pair(folder: Path, arch: str) -> tuple[Path, Path]:
    return write_random_pair(arch, folder / arch, seed=0)


def single_device(target_dir: Path, drafter_dir: Path | None, engine: dict = ENGINE):
    target, drafter = load_models(target_dir, drafter_dir)
    return build_engine(target, drafter, **engine)


def start(target_dir: Path, drafter_dir: Path | None, tp: int, ep: int = 1, proposer=None,
          engine: dict = ENGINE) -> Ranks:
    return Ranks(EngineRecipe(target_dir, drafter_dir, Layout(tp, ep), engine=engine,
                              threads=1, proposer=proposer))


def oracle_for(references: list[list[int]], vocab: int, block: int, target) -> OracleProposer:
    """A proposer that is right at depth d with probability 0.7 (0.2 more at rank 2): real
    acceptance with random weights (picklable through functools.partial)."""
    profile = AcceptanceProfile.constant(block - 1, 0.7, 0.2)
    return OracleProposer(references, vocab, block, profile)


def oracle(references: list[list[int]], vocab: int, block: int):
    return functools.partial(oracle_for, references, vocab, block)


def plain_tokens(engine, prompts=PROMPTS, sampling=GREEDY) -> list[list[int]]:
    with torch.inference_mode():
        return engine.generate(prompts, sampling, Spec.none()).tokens


def specs(block: int) -> list[Spec]:
    """Plain, DFlash, and a DDTree whose budget leaves room for siblings."""
    return [Spec.none(), Spec.dflash(block), Spec.ddtree(block, 2 * block, topk=3)]


def assert_lossless_with_drafts(engine, reference: list[list[int]], block: int,
                                prompts=PROMPTS) -> list:
    """Every method of `specs(block)` gives `reference` (the single-device greedy tokens) and
    the speculative ones really accept drafts (an oracle drafter) -> the runs, in that order."""
    runs = []
    for spec in specs(block):
        with torch.inference_mode():
            run = engine.generate(prompts, GREEDY, spec)
        assert run.tokens == reference, spec
        if spec.method != "none":
            assert run.stats.mean_acceptance > 1.5, (spec, run.stats.acceptance)
        runs.append(run)
    return runs


def tokens_joining_mid_flight(engine, spec: Spec, prompts=PROMPTS) -> list[list[int]]:
    """Each prompt's greedy tokens from a live batch that two requests start, a third joins after
    two rounds, and the last takes the first row freed (continuous batching)."""
    outputs: dict[int, list[int]] = {}
    with torch.inference_mode():
        batch = engine.open_batch(spec)
        rows = {e.row: i for i, e in enumerate(batch.admit(prompts[:2], [GREEDY] * 2))}
        for _ in range(2):
            batch.step()
        (joined,) = batch.admit(prompts[2:3], [GREEDY])
        rows[joined.row] = 2
        pending = [3]
        while batch.live_rows() or pending:
            batch.step()
            for row in [r for r in rows if batch.requests[r] and batch.requests[r].finish]:
                outputs[rows.pop(row)] = batch.requests[row].output
                batch.release(row)
            if pending and batch.free_rows():
                (event,) = batch.admit([prompts[pending[0]]], [GREEDY])
                rows[event.row] = pending.pop()
    return [outputs[i] for i in range(len(prompts))]
