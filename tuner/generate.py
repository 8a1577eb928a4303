"""`dflash-tune generate`: a quick look at the dflash_core engine on real checkpoints.

Loads a target (and a drafter), runs the prompts with the chosen speculation method, and with
`compare` also runs plain decoding on the same prompts so the speedup and the token match are
measured in one run.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tuner.errors import TunerError


@dataclass(slots=True)
class GenerateRequest:
    target: Path
    drafter: Path | None
    prompts: list[str]
    prompt_ids: list[str]
    method: str
    block_size: int | None
    budget: int
    width: int
    depth: int
    spine: bool
    sampling: dict[str, Any]
    device: str
    dtype: str


@dataclass(slots=True)
class GenerateReport:
    texts: list[str]  # one stdout line per prompt
    runs: dict[str, Any]  # label -> dflash_core Generation
    same_tokens: bool | None  # speculative == plain (only with compare)


def require_engine() -> None:
    try:
        import tokenizers  # noqa: F401
        import torch  # noqa: F401
    except ImportError:
        raise TunerError("the engine needs its extra: pip install -e '.[engine]'") from None


def run_generate(req: GenerateRequest, compare: bool) -> GenerateReport:
    require_engine()
    import torch

    from dflash_core import (
        DFlashProposer,
        Engine,
        EngineConfig,
        SamplingParams,
        load_drafter,
        load_target,
    )
    from dflash_core.spec import spec_for

    dtype = getattr(torch, req.dtype)
    target = load_target(req.target, dtype, req.device)
    drafter = load_drafter(req.drafter, target.config, dtype, req.device) if req.drafter else None
    tokenizer = _tokenizer(req.target) if req.prompts else None
    prompts = [tokenizer.encode(p).ids for p in req.prompts] if tokenizer else []
    prompts += [_parse_ids(text) for text in req.prompt_ids]
    if not prompts:
        raise TunerError("give at least one --prompt or --prompt-ids")
    spec = spec_for(req.method, drafter.config.block_size if drafter else None, req.block_size,
                    req.budget, req.width, req.depth, req.spine)
    sampling = SamplingParams(**req.sampling)
    nodes = max(spec.num_nodes, drafter.config.block_size if drafter else 1)
    config = EngineConfig(max_batch=len(prompts),
                          max_context=max(map(len, prompts)) + sampling.max_tokens + 1,
                          max_tree_nodes=nodes)
    engine = Engine(target, DFlashProposer(drafter, target) if drafter else None, config)
    engine.generate(prompts, sampling, spec)  # warm-up: first calls pay one-off allocation costs
    runs = {spec.method: engine.generate(prompts, sampling, spec)}
    if compare and spec.method != "none":
        runs["none"] = engine.generate(prompts, sampling, spec_for("none", None))
    tokens = runs[spec.method].tokens
    same = runs["none"].tokens == tokens if "none" in runs and len(runs) > 1 else None
    # One line per prompt: decoded text as a JSON string (it may hold newlines), else the ids.
    texts = [json.dumps(tokenizer.decode(t)) if tokenizer else " ".join(map(str, t))
             for t in tokens]
    return GenerateReport(texts, runs, same)


def _parse_ids(text: str) -> list[int]:
    try:
        return [int(t) for t in text.replace(",", " ").split()]
    except ValueError:
        raise TunerError(f"--prompt-ids wants integers separated by commas or spaces: {text!r}") \
            from None


def _tokenizer(directory: Path):
    path = directory / "tokenizer.json"
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise TunerError("--prompt needs the `tokenizers` package; use --prompt-ids") from None
    if not path.is_file():
        raise TunerError(f"--prompt needs {path}; use --prompt-ids")
    return Tokenizer.from_file(str(path))
