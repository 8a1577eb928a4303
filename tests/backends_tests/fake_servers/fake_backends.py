"""SGLang and vLLM server backends whose launch commands run through fake_engine.py, on a node of
the deployment's GPUs (the hook ServerBackend offers for commands not runnable as emitted)."""

from __future__ import annotations

import sys
from pathlib import Path

from backends.serving import SGLangBackend, VLLMBackend

FAKE_ENGINE = Path(__file__).parent / "fake_engine.py"


class _OnFakeEngine:
    tokens_per_s: float | None = None  # a stream's speed; None: the fake engine's default

    def executable(self, argv: list[str]) -> list[str]:
        speed = ["--tokens-per-s", str(self.tokens_per_s)] if self.tokens_per_s else []
        return [sys.executable, str(FAKE_ENGINE), "--gpus", str(self.deployment.gpus), *speed,
                *argv]


class FakeSGLangBackend(_OnFakeEngine, SGLangBackend):
    pass


class FakeVLLMBackend(_OnFakeEngine, VLLMBackend):
    pass
