"""The ``model`` backend: predicts what the deployment's engine would measure, without GPUs."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import ClassVar

from backends.base import Backend, refusals
from backends.contract import FailureClass, LaunchFailed, Measurement, Workload
from backends.deployment import Deployment
from backends.flags import PrefillModel, graphed_prefill_tokens, render_command, render_env
from backends.flags import rounds_overlapped
from backends.launch_params import MEASURED_ONLY, InvalidParams, LaunchParams
from backends.perf_model.acceptance import DrafterProfile, chain_acceptance, tree_acceptance
from backends.perf_model.catalog import drafter_arch, load_hardware, load_model
from backends.perf_model.constants import Efficiency
from backends.perf_model.kernels.tables import tables_for
from backends.perf_model.shipped import default_efficiency
from backends.perf_model.memory import kv_capacity_tokens, plan_memory
from backends.perf_model.predict import Setup, predict
from backends.perf_model.step import Node
from backends.session import Session


def unpriced_knobs(measured_kernels: bool) -> frozenset[str]:
    """The knobs the model prices at their defaults: MEASURED_ONLY, less the all-reduce path
    where measured kernel tables time both paths."""
    return MEASURED_ONLY - {"disable_custom_all_reduce"} if measured_kernels else MEASURED_ONLY


class PerfModelBackend(Backend):
    """Step model (the fitted roofline, or measured kernel tables with ``measured_kernels``) +
    acceptance model of one node. Deterministic and CPU-only."""

    name: ClassVar[str] = "model"
    predicts: ClassVar[bool] = True

    def __init__(self, deployment: Deployment, efficiency: Efficiency | None = None) -> None:
        self.deployment = deployment
        hw = load_hardware(deployment.gpu)
        measured = deployment.measured_kernels
        self.node = Node(hw, efficiency or default_efficiency(deployment.gpu, deployment.engine,
                                                              measured),
                         tables_for(hw.measured_system, deployment.engine) if measured else None,
                         deployment.engine)
        self.model = load_model(deployment.model)
        spec = deployment.drafter
        self.drafter = spec and drafter_arch(
            self.model, spec.num_layers, len(spec.target_layers), spec.block_size,
            heads=spec.num_heads, kv_heads=spec.num_kv_heads, head_dim=spec.head_dim,
            intermediate=spec.intermediate_size, chain=spec.chain)
        self.profile = spec and DrafterProfile(spec.acceptance, spec.rank_decay)

    def flags(self, launch: LaunchParams) -> list[str]:
        d = self.deployment
        return render_command(d.engine, launch, d.target, d.engine_version, d.flag_overrides)

    def env(self, launch: LaunchParams) -> dict[str, str]:
        d = self.deployment
        return render_env(d.engine, launch, d.engine_version, d.target)

    @contextlib.contextmanager
    def session(self, launch: LaunchParams, workload: Workload) -> Iterator[Session]:
        """Every reason it cannot launch is the LaunchFailed a server would have reported."""
        with refusals():
            setup = self.setup(launch, workload)
        if setup.plan.infeasible:
            raise LaunchFailed(FailureClass.OOM, setup.plan.infeasible)
        yield _PredictedSession(setup, workload)

    def setup(self, lp: LaunchParams, workload: Workload) -> Setup:
        """Validate ``lp`` for this deployment and fix everything but the concurrency. The
        knobs the model cannot price (MEASURED_ONLY: NCCL's protocol and P2P level, ...) are
        priced at their defaults, never guessed; ``best`` says so of a winner that sets them."""
        self._check(lp)
        self.flags(lp)  # the engine must be able to express it
        lp = lp.priced(unpriced_knobs(self.node.kernels is not None))
        tokens = workload.input_len + workload.output_len + lp.verify_tokens
        d = self.deployment
        plan = plan_memory(self.model, self.drafter, lp, self.node.hw.memory_gib, tokens,
                           d.engine)
        return Setup(self.node, d.engine, self.model, self.drafter, lp, plan,
                     self._acceptance(lp), self._acceptance,
                     rounds_overlapped(d.engine, lp, d.engine_version),
                     graphed_prefill_tokens(d.engine, lp, self._prefill_model(),
                                            d.engine_version))

    def kv_capacity(self, lp: LaunchParams, kv_pool_gib: float | None = None) -> float:
        """Tokens a replica's KV pool holds (what engines log at start-up): a pool of
        ``kv_pool_gib`` per GPU, or the one ``lp``'s memory fraction leaves."""
        if kv_pool_gib is None:
            kv_pool_gib = self.setup(lp, Workload(1, 1, (1,))).plan.kv_pool_gib
        return kv_capacity_tokens(self.model, self.drafter, lp, kv_pool_gib)

    def _prefill_model(self) -> PrefillModel:
        m = self.model
        return PrefillModel(m.architecture, mla=m.kv_heads == 0,
                            linear_attention=m.linear_attention is not None,
                            compute_capability=self.node.hw.compute_capability)

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
            return tree_acceptance(self.profile, lp.speculative_ddtree_budget, lp.tree_width,
                                   lp.tree_depth)
        return chain_acceptance(self.profile, lp.speculative_dflash_block_size)


class _PredictedSession(Session):
    """A 'launch' of the model: the setup is fixed once, each level is a prediction."""

    def __init__(self, setup: Setup, workload: Workload) -> None:
        super().__init__()
        self.setup, self.workload = setup, workload

    def _level(self, concurrency: int, requests: int | None) -> Measurement:
        return predict(self.setup, self.workload, concurrency)
