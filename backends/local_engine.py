"""The dflash_core engine run here, on real checkpoints: what `dflash-tune generate` and
`fixtures build` do, behind the tuner's command line (which reaches the engine only through
backends).

`run_generate` loads a target (and a drafter), runs the prompts with the chosen speculation
method and, with `compare`, also runs plain decoding on the same prompts, so the speedup and the
token match are measured in one run. Problems the user can fix raise ValueError with the reason.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from backends.engine_limits import check_fits
from backends.launch_params import to_spec


@dataclass(slots=True)
class GenerateRequest:
    """What to run; the speculation knobs carry the tuning names, as serve's options do."""

    target: Path
    drafter: Path | None
    prompts: list[str]
    prompt_ids: list[str]
    speculative_algorithm: str
    speculative_dflash_block_size: int | None
    speculative_ddtree_budget: int
    speculative_ddtree_topk: int
    speculative_ddtree_max_depth: int
    speculative_ddtree_round_tokens: int
    spine: bool
    sampling: dict[str, Any]
    device: str
    dtype: str
    stage_timing: bool = False
    tp_size: int = 1  # ranks (processes) the target is split over; LaunchParams' names
    ep_size: int = 1  # expert groups among them (must divide tp_size)
    compile: str = "none"  # EngineConfig.compile


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
        raise ValueError("the engine needs its extra: pip install -e '.[engine]'") from None


def run_generate(req: GenerateRequest, compare: bool) -> GenerateReport:
    """With tp_size > 1 the run goes to ranks started here, and `compare` checks it against
    plain decoding on this one device."""
    require_engine()
    import torch

    from dflash_core import SamplingParams, build_engine
    from dflash_core.runtime.factory import as_dtype
    from dflash_core.runtime.stats import STAGES
    from dflash_core.speculation.spec import Spec

    single_device = req.tp_size == 1 or compare
    target, drafter, target_cfg, drafter_cfg = _models_or_configs(req, single_device)
    tokenizer = _tokenizer(req.target) if req.prompts else None
    prompts = [tokenizer.encode(p).ids for p in req.prompts] if tokenizer else []
    prompts += [_parse_ids(text) for text in req.prompt_ids]
    if not prompts:
        raise ValueError("give at least one --prompt or --prompt-ids")
    trained = drafter_cfg.block_size if drafter_cfg else None
    spec, sampling = to_spec(req, trained, req.spine), SamplingParams(**req.sampling)
    max_context = max(map(len, prompts)) + sampling.max_tokens + 1
    check_fits(target_cfg, drafter_cfg, spec, len(prompts), max_context,
               as_dtype(req.dtype).itemsize, free_memory(torch.device(req.device)))
    options = dict(max_batch=len(prompts), max_context=max_context,
                   max_tree_nodes=max(spec.num_nodes, trained or 1),
                   stage_timing=req.stage_timing, compile=req.compile)
    single = build_engine(target, drafter, **options) if single_device else None
    with _engine_for(req, single, options) as engine:
        engine.generate(prompts, sampling, spec)  # warm-up: first calls pay one-off costs
        runs = {_label(spec.method, req): engine.generate(prompts, sampling, spec)}
    reference = None
    if compare and (spec.method != "none" or req.tp_size > 1):
        reference = "none" if req.tp_size == 1 else "none, 1 device"
        runs[reference] = single.generate(prompts, sampling, Spec.none())
    tokens = next(iter(runs.values())).tokens
    same = runs[reference].tokens == tokens if reference else None
    # One line per prompt: decoded text as a JSON string (it may hold newlines), else the ids.
    texts = [json.dumps(tokenizer.decode(t)) if tokenizer else " ".join(map(str, t))
             for t in tokens]
    return GenerateReport(texts, runs, same, STAGES if req.stage_timing else (), reference)


def _models_or_configs(req: GenerateRequest, single_device: bool):
    """-> (target, drafter, their configs). Without a single-device run (tp > 1, no compare)
    only the configs are read: the ranks load their own shards, and this process no full
    model."""
    from dflash_core import DrafterConfig, load_models
    from dflash_core.models.architectures import target_config
    from dflash_core.models.config import read_config

    if single_device:
        target, drafter = load_models(req.target, req.drafter, req.dtype, req.device)
        return target, drafter, target.config, drafter and drafter.config
    drafter_cfg = DrafterConfig.from_dict(read_config(req.drafter)) if req.drafter else None
    return None, None, target_config(read_config(req.target)), drafter_cfg


@contextlib.contextmanager
def _engine_for(req: GenerateRequest, single, options: dict):
    """The one-device engine, or rank 0's of tp_size ranks (stopped on the way out)."""
    if req.tp_size == 1:
        yield single
        return
    from dflash_core.parallel.layout import Layout
    from dflash_core.parallel.ranks import EngineRecipe, Ranks

    ranks = Ranks(EngineRecipe(req.target, req.drafter, Layout(req.tp_size, req.ep_size),
                               req.dtype, req.device, options))
    try:
        yield ranks.engine
    finally:
        ranks.close()


def _label(method: str, req: GenerateRequest) -> str:
    if req.tp_size == 1:
        return method
    return f"{method}, TP{req.tp_size}" + (f" EP{req.ep_size}" if req.ep_size > 1 else "")


def free_memory(device) -> int:
    """Bytes the engine could still allocate on ``device`` (a torch.device)."""
    import torch

    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:  # MemAvailable counts the page cache the kernel would give back
        meminfo = Path("/proc/meminfo").read_text()
        return int(meminfo.split("MemAvailable:")[1].split()[0]) * 1024
    except (OSError, IndexError, ValueError):
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def fixtures_folder(folder: Path | None) -> Path:
    """The folder `fixtures build` builds into: ``folder``, else $DFLASH_TUNE_PAIR, else the
    shipped one (dflash_core.training.pair.default_pair_dir)."""
    from dflash_core.training.pair import default_pair_dir

    return Path(folder) if folder else default_pair_dir()


def build_fixtures(folder: Path, force: bool, progress=None):
    """-> the build's manifest, or None when ``folder`` was complete already. A folder that
    cannot be written is a ValueError before anything is trained (the build takes minutes)."""
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
    """Create ``folder`` and a file in it, or raise ValueError saying why not."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryFile(dir=folder).close()
    except OSError as err:
        where = f" ({err.filename})" if err.filename and str(err.filename) != str(folder) else ""
        raise ValueError(f"cannot build into {folder}: {err.strerror or err}{where}; give a "
                         "writable folder with --out") from None


def _parse_ids(text: str) -> list[int]:
    try:
        return [int(t) for t in text.replace(",", " ").split()]
    except ValueError:
        raise ValueError(f"--prompt-ids wants integers separated by commas or spaces: {text!r}") \
            from None


def _tokenizer(directory: Path):
    path = Path(directory) / "tokenizer.json"
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise ValueError("--prompt needs the `tokenizers` package; use --prompt-ids") from None
    if not path.is_file():
        raise ValueError(f"--prompt needs {path}; use --prompt-ids")
    return Tokenizer.from_file(str(path))
