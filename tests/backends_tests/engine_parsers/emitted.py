"""Every command `best --emit-flags` can print for the default study and the studies of
docs/examples: seeded samples of each study's space that the space accepts, emitted for SGLang
and vLLM (`best --engine`) by the emitter `best` uses. The checkpoints are fake: local
config.json dirs stand in for the paths under /models."""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from backends.flags import is_experimental
from backends.launch_params import LaunchParams
from tuner.best import emitter_for
from tuner.config import Config
from tuner.config import load_config
from tuner.params import parse
from tuner.wiring import space_context
from tuner.wiring import space_from

REPO = Path(__file__).resolve().parents[3]
ENGINES = ("sglang", "vllm")
# The default study as it is (the model prices it), and run on each real engine (measured: the
# PCIe collective knobs, DCP and vLLM's graph modes are asked); then every example's study.
STUDIES = (("tuner.yaml", {}),
           *(("tuner.yaml", {"backend.name": e, "backend.engine": e}) for e in ENGINES),
           *((f"docs/examples/{name}", {}) for name in (
               "model.yaml", "sglang.yaml", "vllm.yaml", "vllm-cpu-tiny-pair.yaml",
               "vllm-cpu-calibrate.yaml")))
SAMPLES = 120  # a study; enough to reach every choice of every knob (a test checks)


@dataclass(slots=True, frozen=True)
class Emitted:
    study: str  # its config file and the engine its trials ran on
    engine: str  # whose command this is
    device: str  # the launch target's: cuda, or cpu (vLLM's CPU build: no graphs)
    launch: LaunchParams
    argv: tuple[str, ...]
    env: tuple[tuple[str, str], ...]
    experimental: bool  # DDTree: printed for SGLang's DDTREE branch, in no release

    def request(self) -> dict[str, Any]:
        return {"engine": self.engine, "argv": list(self.argv), "env": dict(self.env)}


def emitted(model_dir: Path, drafter_dir: Path) -> list[Emitted]:
    found: dict[tuple, Emitted] = {}
    for path, overrides in STUDIES:
        cfg = _study(path, overrides, model_dir, drafter_dir)
        for command in _commands(cfg, f"{path} (backend {cfg.backend.name})"):
            found.setdefault((command.engine, command.argv, command.env), command)
    return list(found.values())


def _study(path: str, overrides: dict[str, str], model_dir: Path, drafter_dir: Path) -> Config:
    cfg = load_config(REPO / path, overrides)
    if (REPO / cfg.model.path).exists():  # the tiny pair ships in the repository
        return cfg
    return load_config(REPO / path, {**overrides, "model.path": str(model_dir),
                                     "drafter.path": str(drafter_dir)})


def _commands(cfg: Config, study: str) -> list[Emitted]:
    space, context, rng = space_from(cfg), space_context(cfg), random.Random(0)
    launches = []
    for _ in range(SAMPLES):
        params = space.sample(context, rng)
        launch, _ = parse(params)
        if launch is not None and not space.violations(params, context):  # never a trial
            launches.append(launch)
    emitters = [emitter_for(cfg, engine) for engine in ENGINES]
    return [Emitted(study, e.engine, e.target.device, lp, tuple(argv),
                    tuple(sorted(e.env(lp).items())), is_experimental(e.engine, lp))
            for lp in launches for e in emitters
            if (argv := e.argv(lp)) is not None]  # None: `best` never picks it for e.engine
