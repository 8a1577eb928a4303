"""The dflash_core engine run here, on real checkpoints: what `dflash-tune generate` and
`fixtures build` do, behind the tuner's command line (which reaches the engine only through
backends).

`run_generate` loads a target (and a drafter), runs the prompts with the chosen speculation
method and, with `compare`, also runs plain decoding on the same prompts, so the speedup and the
token match are measured in one run. Problems the user can fix raise UserError with the reason.
"""

from __future__ import annotations

import contextlib
import functools
import json
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from backends.engine_builder import Checkpoints, EngineRuntime, open_engine
from backends.errors import UserError
from backends.launch_params import LaunchParams


@dataclass(slots=True)
class GenerateRequest:
    """What to run: the checkpoints, the launch (the one record of the knobs), how this machine
    runs it, the prompts (text and token ids) and SamplingParams' fields."""

    checkpoints: Checkpoints
    launch: LaunchParams
    runtime: EngineRuntime
    prompts: list[str]
    prompt_ids: list[str]
    sampling: dict[str, Any]
    stage_timing: bool = False


@dataclass(slots=True)
class GenerateReport:
    texts: list[str]  # one stdout line per prompt
    runs: dict[str, Any]  # label -> dflash_core Generation
    same_tokens: bool | None  # the first run == the reference run (only with compare)
    stages: tuple[str, ...] = ()  # per-stage times in each run's stats, when asked for
    reference: str | None = None  # label of the plain run compared against

    @property
    def main(self):
        return next(iter(self.runs.values()))


def require_engine() -> None:
    try:
        import tokenizers  # noqa: F401
        import torch  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError:
        raise UserError("the engine needs its extra: pip install -e '.[engine]'") from None


def run_generate(req: GenerateRequest, compare: bool) -> GenerateReport:
    """With tp_size > 1 the run goes to ranks started here, and `compare` checks it against
    plain decoding on this one device."""
    require_engine()
    from dflash_core.runtime.stats import STAGES

    tokenizer = _tokenizer(req.checkpoints.target) if req.prompts else None
    prompts = [tokenizer.encode(p).ids for p in req.prompts] if tokenizer else []
    prompts += [_parse_ids(text) for text in req.prompt_ids]
    if not prompts:
        raise UserError("give at least one --prompt or --prompt-ids")
    sampling = _sampling(req.sampling)
    max_context = max(map(len, prompts)) + sampling.max_tokens + 1
    models = functools.cache(functools.partial(_load, req))
    engine_args = dict(max_context=max_context, max_batch=len(prompts), models=models,
                       stage_timing=req.stage_timing)
    with contextlib.ExitStack() as stack:
        opened = stack.enter_context(open_engine(req.launch, req.checkpoints, req.runtime,
                                                 **engine_args))
        _check_prompts(prompts, opened.target_config.vocab_size, max_context)
        runs = {_label(req.launch): _run(opened.engine, prompts, sampling, opened.spec)}
        reference = _reference(req, opened.spec, compare)
        if reference:
            plain = replace(req.launch, speculative_algorithm="none", tp_size=1, ep_size=1)
            single = opened if req.launch.tp_size == 1 else stack.enter_context(
                open_engine(plain, req.checkpoints, req.runtime, **engine_args))
            runs[reference] = _run(single.engine, prompts, sampling, _plain_spec())
    tokens = next(iter(runs.values())).tokens
    same = runs[reference].tokens == tokens if reference else None
    # One line per prompt: decoded text as a JSON string (it may hold newlines), else the ids.
    texts = [json.dumps(tokenizer.decode(t)) if tokenizer else " ".join(map(str, t))
             for t in tokens]
    return GenerateReport(texts, runs, same, STAGES if req.stage_timing else (), reference)


def _run(engine, prompts, sampling, spec):
    engine.generate(prompts, sampling, spec)  # warm-up: first calls pay one-off costs
    return engine.generate(prompts, sampling, spec)


def _plain_spec():
    from dflash_core import Spec

    return Spec.none()


def _reference(req: GenerateRequest, spec, compare: bool) -> str | None:
    """The label of the plain run `compare` adds, or None when there is nothing to compare."""
    if not compare or (spec.method == "none" and req.launch.tp_size == 1):
        return None
    return "none" if req.launch.tp_size == 1 else "none, 1 device"


def _load(req: GenerateRequest):
    from dflash_core import load_models

    c = req.checkpoints
    return load_models(c.target, c.drafter, req.runtime.dtype, req.runtime.device)


def _sampling(values: dict[str, Any]):
    from dflash_core import SamplingParams

    try:
        return SamplingParams(**values)
    except ValueError as error:
        raise UserError(str(error)) from None


def _check_prompts(prompts: list[list[int]], vocab_size: int, max_context: int) -> None:
    from dflash_core.speculation.spec import checked_prompts

    try:
        checked_prompts(prompts, vocab_size, max_context)
    except ValueError as error:
        raise UserError(str(error)) from None


def _label(launch: LaunchParams) -> str:
    if launch.tp_size == 1:
        return launch.speculative_algorithm
    return (f"{launch.speculative_algorithm}, TP{launch.tp_size}"
            + (f" EP{launch.ep_size}" if launch.ep_size > 1 else ""))


def fixtures_folder(folder: Path | None) -> Path:
    """The folder `fixtures build` builds into: ``folder``, else $DFLASH_TUNE_PAIR, else the
    shipped one (dflash_core.training.pair.default_pair_dir)."""
    from dflash_core.training.pair import default_pair_dir

    return Path(folder) if folder else default_pair_dir()


def build_fixtures(folder: Path, force: bool, progress=None):
    """-> the build's manifest, or None when ``folder`` was complete already. A folder that
    cannot be written is a UserError before anything is trained (the build takes minutes)."""
    require_engine()
    from dflash_core.training.build import build_pair
    from dflash_core.training.pair import is_complete

    if is_complete(folder) and not force:
        return None
    check_writable(folder)
    return build_pair(folder, progress=progress)


def write_random_fixtures(arch: str, out: Path, seed: int) -> dict[str, Any]:
    """A random `arch` target and its matching drafter under ``out`` -> their manifest."""
    require_engine()
    from dflash_core.models.random_checkpoint import write_random_pair

    check_writable(out)
    target, drafter = write_random_pair(arch, out, seed)
    return {"arch": arch, "target": str(target), "drafter": str(drafter), "seed": seed}


def check_writable(folder: Path) -> None:
    """Create ``folder`` and a file in it, or raise UserError saying why not."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryFile(dir=folder).close()
    except OSError as err:
        where = f" ({err.filename})" if err.filename and str(err.filename) != str(folder) else ""
        raise UserError(f"cannot build into {folder}: {err.strerror or err}{where}; give a "
                        "writable folder with --out") from None


def _parse_ids(text: str) -> list[int]:
    try:
        return [int(t) for t in text.replace(",", " ").split()]
    except ValueError:
        raise UserError(f"--prompt-ids wants integers separated by commas or spaces: {text!r}") \
            from None


def _tokenizer(directory: Path):
    path = Path(directory) / "tokenizer.json"
    try:
        import tokenizers  # noqa: F401
    except ImportError:
        raise UserError("--prompt needs the `tokenizers` package; use --prompt-ids") from None
    if not path.is_file():
        raise UserError(f"--prompt needs {path}; use --prompt-ids")
    from dflash_core.training.tokenizer import load_tokenizer

    return load_tokenizer(directory)
