"""Backends that launch a real server per configuration and measure it under load.

One launch serves every concurrency level of the workload (levels are swept inside it). A server
that fails to come up, dies under load or cannot express the configuration becomes a failed
Measurement per level with its class and log excerpt; the study goes on. The server is always
torn down (see `backends.server.launched`), including on Ctrl-C, which still propagates.
"""

from __future__ import annotations

import sys
from dataclasses import replace
from typing import Any, ClassVar

from backends.base import Backend, FailureClass, Measurement, Workload
from backends.deployment import Deployment
from backends.flags import UnsupportedParams, render_command, render_env
from backends.launch_params import InvalidParams, LaunchParams
from backends.prompts import held_out_prompts, random_prompts
from backends.server import ServerError, ServerSpec, free_port, launched


class ServerBackend(Backend):
    """Launch `engine`'s server with a trial's flags and measure it with the load generator."""

    engine: ClassVar[str]
    metrics_flavor: ClassVar[str]
    health_paths: ClassVar[tuple[str, ...]] = ("/health", "/v1/models")

    def __init__(self, deployment: Deployment, start_timeout_s: float = 900.0,
                 requests_per_level: int | None = None, warmup_requests: int = 2,
                 timeout_s: float = 600.0, seed: int = 0) -> None:
        self.deployment = deployment
        self.start_timeout_s, self.timeout_s = start_timeout_s, timeout_s
        self.requests_per_level, self.warmup_requests = requests_per_level, warmup_requests
        self.seed = seed

    def flags(self, params: dict[str, Any]) -> list[str]:
        return self._argv(LaunchParams.from_params(params), self.deployment.target.port)

    def env(self, params: dict[str, Any]) -> dict[str, str]:
        return render_env(self.engine, LaunchParams.from_params(params),
                          self.deployment.engine_version)

    def measure(self, params: dict[str, Any], workload: Workload) -> list[Measurement]:
        try:
            launch = LaunchParams.from_params(params)
            port = free_port(self.deployment.target.host)
            argv = self.executable(self._argv(launch, port))
            env = self.env(params)
        except UnsupportedParams as error:
            return _failed(workload, FailureClass.UNSUPPORTED, str(error))
        except InvalidParams as error:
            return _failed(workload, FailureClass.INVALID_CONFIG, str(error))
        spec = ServerSpec(argv, port, self.deployment.target.host, env, self.health_paths,
                          self.start_timeout_s)
        try:
            with launched(spec) as server:
                rows = self._load(server.base_url, workload)
                server.check()  # a server that died under load is a crash, not slow numbers
                return rows
        except ServerError as error:
            return _failed(workload, error.failure, error.log_excerpt)

    def executable(self, argv: list[str]) -> list[str]:
        """The argv to run here (the emitted command may name a console script)."""
        return argv

    def prompts(self, workload: Workload) -> list[list[int]]:
        """Random token ids of the workload's input length (safe ids for any real vocab)."""
        return random_prompts(min(2 * max(workload.concurrency), 512), workload.input_len,
                              self.seed)

    def _argv(self, params: LaunchParams, port: int) -> list[str]:
        target = replace(self.deployment.target, port=port)
        return render_command(self.engine, params, target, self.deployment.engine_version,
                              self.deployment.flag_overrides)

    def _load(self, base_url: str, workload: Workload) -> list[Measurement]:
        from backends.loadgen import LoadSpec, run_load

        return run_load(LoadSpec(
            base_url=base_url, model=self.deployment.target.model_path,
            prompts=self.prompts(workload), output_len=workload.output_len,
            concurrency_levels=tuple(workload.concurrency),
            requests_per_level=self.requests_per_level, warmup_requests=self.warmup_requests,
            temperature=workload.temperature, timeout_s=self.timeout_s,
            metrics_flavor=self.metrics_flavor))


def _failed(workload: Workload, failure: FailureClass, excerpt: str) -> list[Measurement]:
    return [Measurement.failed(c, failure, excerpt) for c in workload.concurrency]


class SGLangBackend(ServerBackend):
    name = "sglang"
    engine = "sglang"
    metrics_flavor = "sglang"
    health_paths = ("/health_generate", "/health", "/v1/models")


class VLLMBackend(ServerBackend):
    name = "vllm"
    engine = "vllm"
    metrics_flavor = "vllm"


class DFlashServeBackend(ServerBackend):
    """Our own `dflash-tune serve`: the path CI runs end to end on CPU with the tiny pair."""

    name = "serve"
    engine = "dflash"
    metrics_flavor = "dflash"

    def executable(self, argv: list[str]) -> list[str]:
        # The emitted command names the console script; run it with this interpreter.
        return [sys.executable, "-m", "tuner", *argv[1:]] if argv[0] == "dflash-tune" else argv

    def prompts(self, workload: Workload) -> list[list[int]]:
        """The pair's held-out prompts when the target ships them (real acceptance)."""
        return (held_out_prompts(self.deployment.target.model_path, workload.input_len)
                or super().prompts(workload))
