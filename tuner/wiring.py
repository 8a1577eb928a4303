"""From a validated :class:`Config` to the objects backends and spaces take."""

from __future__ import annotations

from typing import Any

from backends import Backend
from backends import Deployment
from backends import DrafterSpec
from backends import Workload
from backends import get_backend
from backends.flags import LaunchTarget
from backends.flags import default_port
from tuner.config import Config


def launch_target_from(cfg: Config) -> LaunchTarget:
    b, d = cfg.backend, cfg.drafter
    port = b.port if b.port is not None else default_port(b.engine)
    kv_bytes = None if b.kv_cache_gib is None else int(b.kv_cache_gib * 2**30)
    return LaunchTarget(model_path=cfg.model.path, drafter_path=d.path if d else None,
                        host=b.host, port=port, context_length=b.context_length,
                        extra_args=tuple(b.extra_args), launcher=tuple(b.launcher),
                        env=tuple(sorted(b.env.items())), device=b.device,
                        kv_cache_bytes=kv_bytes)


def deployment_from(cfg: Config) -> Deployment:
    b, d = cfg.backend, cfg.drafter
    target = launch_target_from(cfg)
    drafter = d and DrafterSpec(
        block_size=d.block_size, num_layers=d.num_layers, target_layers=tuple(d.target_layers),
        num_heads=d.num_heads, num_kv_heads=d.num_kv_heads, head_dim=d.head_dim,
        intermediate_size=d.intermediate_size, acceptance=tuple(d.acceptance),
        rank_decay=d.rank_decay)
    return Deployment(gpu=cfg.hardware.gpu, gpus=cfg.hardware.gpus, model=cfg.model.name,
                      target=target, drafter=drafter, engine=b.engine,
                      engine_version=b.engine_version, flag_overrides=dict(b.flag_overrides),
                      measured_kernels=measured_kernels(cfg))


def measured_kernels(cfg: Config) -> bool:
    """Whether the model backend prices kernels from measured tables: as the config says, else
    wherever the GPU has them."""
    from backends.perf_model.shipped import measured_kernels_for

    return measured_kernels_for(cfg.hardware.gpu, cfg.backend.measured_kernels)


def model_speedup_error(cfg: Config) -> float:
    """The performance model's typical relative error on a speedup over plain decoding, for the
    way it prices kernels on this config's GPU (its validation against published sources)."""
    from backends.perf_model.shipped import speedup_error

    return speedup_error(measured_kernels(cfg))


def workload_from(cfg: Config) -> Workload:
    w = cfg.workload
    return Workload(input_len=w.input_len, output_len=w.output_len,
                    concurrency=tuple(w.concurrency), dataset=w.dataset,
                    dataset_output_lens=w.dataset_output_lens, request_rate=w.request_rate)


def backend_from(cfg: Config) -> Backend:
    options: dict[str, Any] = {}
    if cfg.backend.name in ("model", "simulated"):
        options["efficiency"] = efficiency_from(cfg)
    if cfg.backend.name == "simulated":
        from backends.simulated import Simulation

        sim = cfg.backend.simulation
        options["simulation"] = Simulation(
            noise=sim.noise, launch_s=sim.launch_s, reference_requests=sim.reference_requests,
            launch_share=sim.launch_share, real_time=sim.real_time, seed=sim.seed)
        options["truth_efficiency"] = sim.efficiency and truth_efficiency_from(cfg)
        options["truth_acceptance"] = sim.acceptance
    return get_backend(cfg.backend.name, deployment_from(cfg), **options)


def efficiency_from(cfg: Config):
    """The shipped constants for the configured GPU, with what the config sets over them."""
    from backends.perf_model import Efficiency
    from backends.perf_model.shipped import default_efficiency

    base = default_efficiency(cfg.hardware.gpu, cfg.backend.engine,
                              measured_kernels(cfg)).as_dict()
    return Efficiency(**{**base, **cfg.backend.efficiency})


def truth_efficiency_from(cfg: Config):
    """The simulated node's hidden constants: the tuner's model with what
    ``backend.simulation.efficiency`` names over it (the truth differs in those, not the rest)."""
    from backends.perf_model import Efficiency

    return Efficiency(**{**efficiency_from(cfg).as_dict(), **cfg.backend.simulation.efficiency})


def truth_screen(cfg: Config, samples: int):
    """The simulated node's noiseless truth as a screen: ``predict(params).goodput`` is what a
    configuration really serves at the SLA there."""
    from dataclasses import replace

    from tuner.launches.screen import Screen

    sim, dep = cfg.backend.simulation, deployment_from(cfg)
    if sim.acceptance and dep.drafter:
        dep = replace(dep, drafter=replace(dep.drafter, acceptance=tuple(sim.acceptance)))
    return Screen(dep, space_from(cfg), space_context(cfg), workload_from(cfg),
                  cfg.workload.limits, max(cfg.workload.concurrency),
                  truth_efficiency_from(cfg), samples=samples)


def space_from(cfg: Config):
    """The study's search space, its parameter names checked against LaunchParams."""
    from dataclasses import fields

    from backends.launch_params import LaunchParams
    from search_spaces import load_space

    return load_space(cfg.search_space,
                      known_params=frozenset(f.name for f in fields(LaunchParams)))


def space_context(cfg: Config) -> dict[str, Any]:
    """Names a search space's expressions may use about this deployment."""
    from backends.perf_model.catalog import load_model

    from tuner.config_checks import MEASURED

    model = load_model(cfg.model.name)
    return {
        "gpus": cfg.hardware.gpus,
        "num_experts": model.num_experts,
        "drafter_block_size": cfg.drafter.block_size if cfg.drafter else 1,
        "engine": cfg.backend.engine,
        # A real engine runs the trials: knobs only a measurement can tell apart are worth
        # asking about (the model prices them at their defaults).
        "measured": cfg.backend.name in MEASURED,
        "max_concurrency": max(cfg.workload.concurrency),
    }


def prompt_warning(cfg: Config) -> str | None:
    """Read the workload's dataset once, so a bad file stops `run` before any launch
    (``ConfigError``); say so when a measuring backend would send random token ids."""
    from backends.datasets import DatasetError
    from backends.prompts import RANDOM_SOURCE, prompt_set, prompt_source
    from tuner.config_checks import MEASURED
    from tuner.errors import ConfigError

    if cfg.backend.name not in MEASURED:
        return None
    workload = workload_from(cfg)
    if workload.dataset:
        try:
            prompt_set(workload, cfg.model.path, 1)
        except DatasetError as error:
            raise ConfigError([f"workload.dataset: {error}"]) from None
        return None
    if prompt_source(workload, cfg.model.path) != RANDOM_SOURCE:
        return None
    return ("the prompts are random token ids, which understate a drafter's acceptance (it "
            "never saw such text); set workload.dataset to real prompts")
