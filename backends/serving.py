"""Backends that launch a real server per configuration and measure it under load.

One launch serves every concurrency level of the workload (levels are swept inside it). A server
that fails to come up, dies under load or cannot express the configuration becomes a failed
Measurement per level with its class and log excerpt; the study goes on. The server is always
torn down (see `backends.server.launched`), including on Ctrl-C, which still propagates.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from typing import ClassVar

import httpx

from backends.base import Backend, refusals
from backends.contract import FailureClass, LaunchFailed, Measurement, Workload
from backends.deployment import Deployment
from backends.drain import wait_drained
from backends.flags import render_command, render_env
from backends.launch_params import LaunchParams
from backends.loadgen import LoadSpec, run_load
from backends.prompts import PromptSet, prompt_set
from backends.server import RunningServer, ServerError, ServerSpec, free_port, launched
from backends.session import Session


class ServerBackend(Backend):
    """Launch `engine`'s server with a trial's flags and measure it with the load generator."""

    engine: ClassVar[str]
    metrics_flavor: ClassVar[str]
    health_paths: ClassVar[tuple[str, ...]] = ("/health", "/v1/models")
    stop_timeout_s: ClassVar[float] = 10.0  # SIGTERM grace before the group is SIGKILLed

    def __init__(self, deployment: Deployment, start_timeout_s: float = 900.0,
                 requests_per_level: int | None = None, warmup_requests: int = 2,
                 timeout_s: float = 600.0, seed: int = 0) -> None:
        self.deployment = deployment
        self.start_timeout_s, self.timeout_s = start_timeout_s, timeout_s
        self.requests_per_level, self.warmup_requests = requests_per_level, warmup_requests
        self.seed = seed

    def flags(self, launch: LaunchParams) -> list[str]:
        return self._argv(launch, self.deployment.target.port)

    def env(self, launch: LaunchParams) -> dict[str, str]:
        return render_env(self.engine, launch, self.deployment.engine_version,
                          self.deployment.target)

    @contextlib.contextmanager
    def session(self, launch: LaunchParams, workload: Workload) -> Iterator[Session]:
        with refusals():
            port = free_port(self.deployment.target.host)
            argv = self.executable(self._argv(launch, port))
            env = self.env(launch)
        spec = ServerSpec(argv, port, self.deployment.target.host, env, self.health_paths,
                          self.start_timeout_s, self.stop_timeout_s)
        began = time.perf_counter()
        try:
            with launched(spec) as server:
                session = _ServerSession(self, server, workload, launch.gpus)
                session.clock.launch_s = time.perf_counter() - began
                yield session
        except ServerError as error:
            raise LaunchFailed(error.failure, error.log_excerpt) from error

    def executable(self, argv: list[str]) -> list[str]:
        """The argv to run here (the emitted command may name a console script)."""
        return argv

    def prompts(self, workload: Workload) -> PromptSet:
        """The workload's dataset, else the target's held-out prompts, else random ids."""
        return prompt_set(workload, self.deployment.target.model_path,
                          min(2 * max(workload.concurrency), 512), self.seed)

    def _argv(self, params: LaunchParams, port: int) -> list[str]:
        target = replace(self.deployment.target, port=port)
        return render_command(self.engine, params, target, self.deployment.engine_version,
                              self.deployment.flag_overrides)

    def load_spec(self, base_url: str, workload: Workload, prompts: PromptSet,
                  concurrency: int, requests: int | None) -> LoadSpec:
        return LoadSpec(
            base_url=base_url, model=self.deployment.target.model_path,
            prompts=prompts.prompts, output_len=workload.output_len,
            output_lens=prompts.output_lens, concurrency_levels=(concurrency,),
            requests_per_level=requests or self.requests_per_level,
            warmup_requests=self.warmup_requests, temperature=workload.temperature,
            timeout_s=self.timeout_s, metrics_flavor=self.metrics_flavor,
            request_rate=workload.request_rate, seed=self.seed)


DEATH_SETTLE_S = 2.0


class _ServerSession(Session):
    """A running server: levels, probes and health checks against it."""

    def __init__(self, backend: ServerBackend, server: RunningServer, workload: Workload,
                 gpus: int) -> None:
        super().__init__()
        self.backend, self.server, self.workload = backend, server, workload
        self.gpus = gpus  # what output_tok_s_per_gpu divides by: the launch's, not the node's
        self.prompts = backend.prompts(workload)  # once a launch: a dataset is read once

    def _level(self, concurrency: int, requests: int | None) -> Measurement:
        died = self.alive()
        if died:
            return Measurement.failed(concurrency, died, self.server.log_excerpt())
        left = wait_drained(self.server.base_url, self.backend.metrics_flavor)
        if left:
            return Measurement.failed(concurrency, FailureClass.TRANSIENT,
                                      f"server still held {left:g} requests before this level")
        spec = self.backend.load_spec(self.server.base_url, self.workload, self.prompts,
                                      concurrency, requests)
        row = run_load(spec, self.gpus)[0]
        # A server that died under load is a crash, not slow numbers. Its sockets close before
        # the kernel reports the exit, so failed requests give it a moment to show it died.
        died = self.alive() or (None if row.ok else self._death_within(DEATH_SETTLE_S))
        return Measurement.failed(concurrency, died, self.server.log_excerpt()) if died else row

    def _death_within(self, seconds: float) -> FailureClass | None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            time.sleep(0.05)
            if died := self.alive():
                return died
        return None

    def alive(self) -> FailureClass | None:
        try:
            self.server.check()
        except ServerError as error:
            return error.failure
        return None

    def generate(self, prompts: list[list[int]], max_tokens: int) -> list[str]:
        body = {"model": self.backend.deployment.target.model_path, "max_tokens": max_tokens,
                "temperature": 0.0, "stream": False}
        with httpx.Client(base_url=self.server.base_url, timeout=self.backend.timeout_s,
                          trust_env=False) as client:
            return [_completion_text(client.post("/v1/completions", json={**body, "prompt": p}))
                    for p in prompts]


def _completion_text(response: httpx.Response) -> str:
    response.raise_for_status()
    return response.json()["choices"][0]["text"]


class SGLangBackend(ServerBackend):
    name = "sglang"
    engine = "sglang"
    metrics_flavor = "sglang"
    health_paths = ("/health_generate", "/health", "/v1/models")


class VLLMBackend(ServerBackend):
    name = "vllm"
    engine = "vllm"
    metrics_flavor = "vllm"
    # Its API server, EngineCore and Worker processes shut down in turn, and each holds shared
    # memory that only a clean exit unlinks.
    stop_timeout_s = 30.0


class DFlashServeBackend(ServerBackend):
    """Our own `dflash-tune serve`: the path CI runs end to end on CPU with the tiny pair."""

    name = "serve"
    engine = "dflash"
    metrics_flavor = "dflash"

    def executable(self, argv: list[str]) -> list[str]:
        # The emitted command names the console script (`dflash-tune serve ...`); the server
        # itself lives in backends, so run it with this interpreter without the tuner.
        if argv[:2] == ["dflash-tune", "serve"]:
            return [sys.executable, "-m", "backends.dflash_server", *argv[2:]]
        return argv
