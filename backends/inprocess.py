"""The in-process backend: dflash_core run directly, no HTTP, for fast tuning of block size,
tree shape, the running cap and the TP / EP layout on the machine at hand (the CPU in CI; a
launch with tp_size > 1 starts its other ranks as processes for the session's length).

Each concurrency level is a closed loop over the engine's live batch: `c` requests in flight,
each replaced by a new one as it finishes; requests beyond the running cap wait for a free row
(their TTFT includes the wait, as behind a server). Timings are taken per round, so tokens a
round emits together share a timestamp, as a streaming server would deliver them.
"""

from __future__ import annotations

import contextlib
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any, ClassVar

from backends.base import Backend, refusals
from backends.contract import FailureClass, LaunchFailed, Measurement, Workload
from backends.deployment import Deployment
from backends.engine_builder import Checkpoints, EngineRuntime, open_engine
from backends.engine_limits import WontFit
from backends.errors import UserError
from backends.flags import render_command
from backends.latency import LevelResult, RequestResult
from backends.launch_params import LaunchParams
from backends.prompts import prompt_set
from backends.session import Session


class InProcessBackend(Backend):
    name: ClassVar[str] = "inprocess"

    def __init__(self, deployment: Deployment, device: str = "cpu", dtype: str = "float32",
                 requests_per_level: int | None = None, warmup_requests: int = 2,
                 seed: int = 0) -> None:
        self.deployment, self.device, self.dtype = deployment, device, dtype
        self.requests_per_level, self.warmup_requests, self.seed = (
            requests_per_level, warmup_requests, seed)
        self._models: tuple[Any, Any] | None = None  # loaded once, reused by every trial

    def flags(self, launch: LaunchParams) -> list[str]:
        """The `dflash-tune serve` command that runs the same engine configuration."""
        return render_command("dflash", launch, self.deployment.target)

    @contextlib.contextmanager
    def session(self, launch: LaunchParams, workload: Workload) -> Iterator[Session]:
        """A 'launch' builds the engine for ``launch`` (the models stay loaded across them)."""
        began = time.perf_counter()
        with refusals():
            self.flags(launch)  # what the server could not express, this cannot run either
        with contextlib.ExitStack() as stack:
            try:
                opened = stack.enter_context(open_engine(
                    launch, self._checkpoints(), EngineRuntime(self.device, self.dtype),
                    max_context=workload.input_len + workload.output_len + 1,
                    models=self._load))
                if opened.engine.config.fixed_shapes:  # part of the launch, as a capture is
                    _capture(opened.engine, opened.spec, workload)
            except Exception as error:
                raise LaunchFailed(failure_of(error), _text(error)) from error
            session = _EngineSession(self, opened.engine, opened.spec, workload)
            session.clock.launch_s = time.perf_counter() - began
            yield session

    def _checkpoints(self) -> Checkpoints:
        t = self.deployment.target
        return Checkpoints(Path(t.model_path), t.drafter_path and Path(t.drafter_path))

    def _load(self):
        if self._models is None:  # loaded once, kept across launches
            from dflash_core import load_models

            t = self.deployment.target
            self._models = load_models(t.model_path, t.drafter_path, self.dtype, self.device)
        return self._models


def failure_of(error: BaseException) -> FailureClass:
    """The failure class of an exception out of the engine, by its type: a launch the user can
    fix is invalid_config (oom when it cannot fit), running out of memory is oom, and anything
    else is a crash (an engine bug must stop a study, not steer it away)."""
    if isinstance(error, WontFit) or _out_of_memory(error):
        return FailureClass.OOM
    if isinstance(error, UserError):
        return FailureClass.INVALID_CONFIG
    return FailureClass.CRASH


def _out_of_memory(error: BaseException) -> bool:
    import torch

    return isinstance(error, (MemoryError, torch.OutOfMemoryError)) or (
        isinstance(error, RuntimeError) and "can't allocate memory" in str(error))


def _text(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"


def _capture(engine, spec, workload: Workload) -> None:
    import torch

    with torch.inference_mode():
        engine.open_batch(spec).capture(modes=("sample" if workload.temperature > 0
                                               else "greedy",))


class _EngineSession(Session):
    def __init__(self, backend: InProcessBackend, engine, spec, workload: Workload) -> None:
        from dflash_core import SamplingParams

        super().__init__()
        self.backend, self.engine, self.spec, self.warm = backend, engine, spec, False
        if workload.request_rate is not None:
            raise UserError("the in-process backend measures closed loops only; "
                            "workload.request_rate needs a server backend")
        prompts = prompt_set(workload, backend.deployment.target.model_path, 64, backend.seed)
        if not all(isinstance(p, list) for p in prompts.prompts):
            raise UserError(f"{prompts.source}: the in-process engine takes token ids, and "
                            "the target has no tokenizer.json to make them from text")
        # No stop tokens: every request produces exactly its max_tokens, like ignore_eos.
        sampling = SamplingParams(temperature=workload.temperature,
                                  max_tokens=workload.output_len, seed=backend.seed)
        lens = prompts.output_lens or [workload.output_len] * len(prompts.prompts)
        self.requests = [(p, replace(sampling, max_tokens=n))
                         for p, n in zip(prompts.prompts, lens)]

    def _level(self, concurrency: int, requests: int | None) -> Measurement:
        b = self.backend
        try:
            if not self.warm:  # first-call work (allocations, kernels) stays out of the numbers
                self._closed_loop(1, b.warmup_requests)
                self.warm = True
            total = requests or b.requests_per_level or max(2 * concurrency, 8)
            return self._closed_loop(concurrency, total).measurement()
        except Exception as error:
            return Measurement.failed(concurrency, failure_of(error), _text(error))

    def _closed_loop(self, concurrency: int, total: int) -> LevelResult:
        import torch

        with torch.inference_mode():
            batch = self.engine.open_batch(self.spec, seed=self.backend.seed)
            return _ClosedLoop(batch, self.requests, concurrency, total).run()

    def generate(self, prompts: list[list[int]], max_tokens: int) -> list[str]:
        import torch

        from dflash_core import SamplingParams

        step, texts = self.engine.config.max_batch, []
        with torch.inference_mode():
            for i in range(0, len(prompts), step):  # never more at once than the running cap
                out = self.engine.generate(prompts[i:i + step],
                                           SamplingParams(max_tokens=max_tokens), self.spec)
                texts += [" ".join(map(str, tokens)) for tokens in out.tokens]
        return texts


class _ClosedLoop:
    def __init__(self, batch, requests, concurrency: int, total: int) -> None:
        self.batch, self.requests = batch, requests  # (prompt ids, SamplingParams), cycled
        self.concurrency, self.total = concurrency, total
        self.results: list[RequestResult] = []
        self.waiting: deque[tuple[RequestResult, tuple]] = deque()
        self.by_row: dict[int, RequestResult] = {}

    def run(self) -> LevelResult:
        began = time.perf_counter()
        while self._unfinished():
            self._arrive()
            self._admit()
            self._record(self.batch.step())
        accept = self.batch.stats.mean_acceptance or None
        return LevelResult(self.concurrency, self.results, time.perf_counter() - began, accept)

    def _unfinished(self) -> bool:
        return len(self.results) < self.total or any(r.end_s is None for r in self.results)

    def _arrive(self) -> None:
        in_flight = sum(r.end_s is None for r in self.results)
        while in_flight < self.concurrency and len(self.results) < self.total:
            result = RequestResult(start_s=time.perf_counter())
            self.results.append(result)
            self.waiting.append((result, self.requests[len(self.results) % len(self.requests)]))
            in_flight += 1

    def _admit(self) -> None:
        for row in [r for r in self.batch.free_rows() if self.batch.requests[r] is not None]:
            self.batch.release(row)
        room = min(len(self.waiting), len(self.batch.free_rows()))
        joining = [self.waiting.popleft() for _ in range(room)]
        events = self.batch.admit([p for _, (p, _) in joining], [s for _, (_, s) in joining])
        for (result, _), event in zip(joining, events):
            self.by_row[event.row] = result
        self._record(events)

    def _record(self, events) -> None:
        now = time.perf_counter()
        for event in events:
            result = self.by_row[event.row]
            if result.first_token_s is None and event.tokens:
                result.first_token_s = now
            result.token_times += [now] * len(event.tokens)
            result.output_tokens += len(event.tokens)
            if event.finish:
                result.end_s = now

