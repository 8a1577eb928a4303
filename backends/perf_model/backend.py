"""The ``model`` backend: predicts what the deployment's engine would measure, without GPUs."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any
from typing import ClassVar

from backends.base import Backend
from backends.base import FailureClass
from backends.base import Measurement
from backends.base import Workload
from backends.deployment import Deployment
from backends.flags import UnsupportedParams
from backends.flags import render_command
from backends.flags import render_env
from backends.launch_params import InvalidParams
from backends.launch_params import LaunchParams
from backends.perf_model.acceptance import AcceptanceProfile
from backends.perf_model.acceptance import chain_acceptance
from backends.perf_model.acceptance import tree_acceptance
from backends.perf_model.catalog import drafter_arch
from backends.perf_model.catalog import load_hardware
from backends.perf_model.catalog import load_model
from backends.perf_model.constants import Efficiency
from backends.perf_model.memory import plan_memory
from backends.perf_model.predict import Setup
from backends.perf_model.predict import predict
from backends.perf_model.step import Node
from backends.session import LaunchFailed
from backends.session import Session


class PerfModelBackend(Backend):
    """Roofline + interconnect + acceptance model of one node. Deterministic and CPU-only."""

    name: ClassVar[str] = "model"
    predicts: ClassVar[bool] = True

    def __init__(self, deployment: Deployment, efficiency: Efficiency | None = None) -> None:
        self.deployment = deployment
        hw = load_hardware(deployment.gpu)
        self.node = Node(hw, efficiency or Efficiency(collective_latency_us=hw.collective_latency_us))
        self.model = load_model(deployment.model)
        spec = deployment.drafter
        self.drafter = spec and drafter_arch(
            self.model, spec.num_layers, len(spec.target_layers), spec.block_size,
            heads=spec.num_heads, kv_heads=spec.num_kv_heads, head_dim=spec.head_dim,
            intermediate=spec.intermediate_size)
        self.profile = spec and AcceptanceProfile(spec.acceptance, spec.rank_decay)

    def flags(self, params: dict[str, Any]) -> list[str]:
        d = self.deployment
        return render_command(d.engine, LaunchParams.from_params(params), d.target,
                              d.engine_version, d.flag_overrides)

    def env(self, params: dict[str, Any]) -> dict[str, str]:
        d = self.deployment
        return render_env(d.engine, LaunchParams.from_params(params), d.engine_version)

    def measure(self, params: dict[str, Any], workload: Workload) -> list[Measurement]:
        try:
            setup = self.checked_setup(params, workload)
        except LaunchFailed as err:
            return self._failed(workload, err.failure, err.log_excerpt)
        return [predict(setup, workload, c) for c in workload.concurrency]

    @contextlib.contextmanager
    def session(self, params: dict[str, Any], workload: Workload) -> Iterator[Session]:
        yield _PredictedSession(self.checked_setup(params, workload), workload)

    def checked_setup(self, params: dict[str, Any], workload: Workload) -> Setup:
        """``setup`` with every reason it cannot launch as LaunchFailed (what a server would
        have said)."""
        try:
            setup = self.setup(params, workload)
        except UnsupportedParams as err:
            raise LaunchFailed(FailureClass.UNSUPPORTED, str(err)) from err
        except InvalidParams as err:
            raise LaunchFailed(FailureClass.INVALID_CONFIG, str(err)) from err
        except (TypeError, ValueError) as err:  # a wrongly typed value, e.g. tp_size="8"
            raise LaunchFailed(FailureClass.INVALID_CONFIG,
                               f"{type(err).__name__}: {err}") from err
        if setup.plan.infeasible:
            raise LaunchFailed(FailureClass.OOM, setup.plan.infeasible)
        return setup

    def setup(self, params: dict[str, Any], workload: Workload) -> Setup:
        """Validate ``params`` for this deployment and fix everything but the concurrency."""
        lp = LaunchParams.from_params(params)
        self._check(lp)
        self.flags(params)  # the engine must be able to express it
        tokens = workload.input_len + workload.output_len + lp.verify_tokens
        plan = plan_memory(self.model, self.drafter, lp, self.node.hw.memory_gib, tokens)
        return Setup(self.node, self.model, self.drafter, lp, plan, self._acceptance(lp))

    def _check(self, lp: LaunchParams) -> None:
        d = self.deployment
        if lp.gpus != d.gpus:
            raise InvalidParams(f"tp_size x dp_size = {lp.gpus}, the node has {d.gpus} GPUs")
        if self.model.is_moe and self.model.num_experts % lp.ep_size:
            raise InvalidParams(f"ep_size {lp.ep_size} does not divide "
                                f"{self.model.num_experts} experts")
        if lp.speculative and d.drafter is None:
            raise InvalidParams("speculation needs a drafter in the config")
        if lp.speculative and lp.speculative_dflash_block_size > d.drafter.block_size:
            raise InvalidParams(f"block size {lp.speculative_dflash_block_size} exceeds the "
                                f"drafter's trained block size {d.drafter.block_size}")

    def _acceptance(self, lp: LaunchParams):
        if not lp.speculative:
            return None
        if lp.is_ddtree:
            return tree_acceptance(self.profile, lp.speculative_ddtree_budget,
                                   lp.speculative_ddtree_topk, lp.tree_depth)
        return chain_acceptance(self.profile, lp.speculative_dflash_block_size)

    @staticmethod
    def _failed(workload: Workload, failure: FailureClass, why: str) -> list[Measurement]:
        return [Measurement.failed(c, failure, why, predicted=True) for c in workload.concurrency]


class _PredictedSession(Session):
    """A 'launch' of the model: the setup is fixed once, each level is a prediction."""

    def __init__(self, setup: Setup, workload: Workload) -> None:
        super().__init__()
        self.setup, self.workload = setup, workload

    def _level(self, concurrency: int, requests: int | None) -> Measurement:
        return predict(self.setup, self.workload, concurrency)
