"""``tuner.yaml``: the one config file, validated by pydantic at this boundary only.

Defaults describe the reference node (8x RTX PRO 6000 on PCIe, Kimi K2.6 with a block-8 DFlash
drafter, SGLang) and the model backend, so ``dflash-tune run`` works with no file at all.
"""

from __future__ import annotations

import ipaddress
import re
from pathlib import Path
from typing import Any
from typing import Literal

from pydantic import BaseModel
from pydantic import ConfigDict
from pydantic import Field
from pydantic import ValidationError
from pydantic import field_validator
from pydantic import model_validator

from backends.contract import MAX_CONCURRENCY
from tuner.config_checks import catalog_problems
from tuner.config_file import read_config_yaml
from tuner.errors import ConfigError
from tuner.sla import Limit
from tuner.sla import with_bounds
from tuner.storage import url_problem

SAMPLERS = ("tpe", "random", "nsga2")


class _Section(BaseModel):
    # strict: YAML's `true` is no integer (pydantic would read 1) and "8" is no number.
    model_config = ConfigDict(extra="forbid", strict=True)


class StudyConfig(_Section):
    # Stored in String(512) columns; PostgreSQL refuses longer values and any NUL character.
    name: str = Field("pcie8-kimi-sglang", min_length=1, max_length=512)
    storage: str = "sqlite:///results.db"
    sampler: Literal["tpe", "random", "nsga2"] = "tpe"
    seed: int | None = 0
    n_trials: int = Field(200, ge=1)
    # A running trial's worker writes a heartbeat this often (seconds); a trial silent for twice
    # as long is failed and its configuration re-queued (docs/SCALE_OUT.md). 30 s costs one tiny
    # write a worker every 30 s and retries a dead worker's trial about a minute later. null
    # turns heartbeats off: then nothing retries, and concurrent workers can overshoot n_trials.
    heartbeat_s: int | None = Field(30, ge=1)
    # How often one configuration is re-queued after workers died running it.
    max_retries: int = Field(3, ge=0)

    @field_validator("name")
    @classmethod
    def _no_nul(cls, name: str) -> str:
        if "\x00" in name:
            raise ValueError("must not contain a NUL character")
        return name

    @field_validator("storage")
    @classmethod
    def _postgres_driver(cls, url: str) -> str:
        # SQLAlchemy 2.1 reads a bare postgresql:// as psycopg 3; the `postgres` extra installs
        # psycopg2, so that is what the bare form means here (name a driver to pick another).
        bare = "postgresql://"
        url = "postgresql+psycopg2://" + url[len(bare):] if url.startswith(bare) else url
        problem = url_problem(url)  # syntax, dialect and driver: what needs no connection
        if problem:
            raise ValueError(problem)
        return url


class HardwareConfig(_Section):
    gpu: str = "rtx-pro-6000-server"
    gpus: int = Field(8, ge=1)


class ModelSection(_Section):
    # What the performance model reasons about: a catalog name or a path to an HF config.json.
    name: str = "kimi-k2.6"
    # The checkpoint path on the serving node, as it goes into the launch command.
    path: str = "/models/Kimi-K2.6"


class DrafterSection(_Section):
    path: str = "/models/Kimi-K2.6-DFlash"
    block_size: int = Field(8, ge=2)
    num_layers: int = Field(6, ge=1)
    target_layers: list[int] = [1, 12, 24, 35, 47, 58]
    num_heads: int = 64
    num_kv_heads: int = 8
    head_dim: int = 128
    intermediate_size: int | None = 18432
    # Per-position top-1 acceptance given a correct prefix; 0.75 gives 3.6 tokens a block-8
    # step, inside the 3.5-4.1 measured on the reference node.
    acceptance: list[float] = [0.75]
    rank_decay: float = Field(0.6, ge=0.0, lt=1.0)

    @field_validator("acceptance")
    @classmethod
    def _probabilities(cls, value: list[float]) -> list[float]:
        if not value or any(not 0.0 <= a <= 1.0 for a in value):
            raise ValueError("must be a non-empty list of probabilities in [0, 1]")
        return value


class WorkloadConfig(_Section):
    input_len: int = Field(1024, ge=1)
    output_len: int = Field(512, ge=1)
    concurrency: list[int] = [1, 4, 16, 32, 64, 128, 256]
    # Throughput is maximised at this level; the SLA applies there.
    target_concurrency: int = Field(64, ge=1, le=MAX_CONCURRENCY)
    sla: list[str] = ["tpot_p50_ms<=100"]
    # Bounds on time to first token that hold beside `sla` (and `best --sla`) unless it names the
    # metric; null drops one. TPOT alone misses queueing: with a running cap below the load, TPOT
    # stays flat while requests wait minutes for their first token.
    ttft_p50_ms: float | None = Field(5000.0, gt=0)
    ttft_p99_ms: float | None = Field(15000.0, gt=0)
    # Real prompts for measuring backends (JSONL of prompt text or ids, `vllm bench serve`'s
    # custom format, ShareGPT JSON); null: the target's held-out prompts if it ships them, else
    # random ids, which understate a drafter's acceptance.
    dataset: str | None = None
    dataset_output_lens: bool = False  # the dataset's reply lengths instead of output_len
    request_rate: float | None = Field(None, gt=0)  # open-loop Poisson arrivals, requests/s

    @field_validator("sla")
    @classmethod
    def _limits(cls, value: list[str]) -> list[str]:
        for text in value:
            Limit.parse(text)
        return value

    @model_validator(mode="after")
    def _levels(self) -> WorkloadConfig:
        if any(not 1 <= c <= MAX_CONCURRENCY for c in self.concurrency):
            raise ValueError(f"concurrency levels must be in 1..{MAX_CONCURRENCY} (concurrent "
                             "requests a node can hold)")
        # Both objectives need their level measured.
        self.concurrency = sorted(set(self.concurrency) | {1, self.target_concurrency})
        return self

    @property
    def limits(self) -> list[Limit]:
        return with_bounds([Limit.parse(text) for text in self.sla], self.bounds)

    @property
    def bounds(self) -> list[Limit]:
        return [Limit(metric, "<=", value) for metric in ("ttft_p50_ms", "ttft_p99_ms")
                if (value := getattr(self, metric)) is not None]


class SimulationConfig(_Section):
    """`backend.name: simulated`: the performance model as a hidden truth, measured with noise
    and launch cost (see backends/simulated.py)."""

    noise: float = Field(0.15, ge=0.0, le=1.0)
    launch_s: float = Field(180.0, ge=0.0)
    reference_requests: int = Field(64, ge=1)
    launch_share: float = Field(0.5, ge=0.0, le=1.0)  # of the variance, from the launch
    real_time: float = Field(0.0, ge=0.0, le=1.0)
    seed: int = 0
    # The truth's own constants and drafter acceptance (default: backend.efficiency and
    # drafter.acceptance), so the tuner's model starts out wrong, as on a real node.
    efficiency: dict[str, float] | None = None
    acceptance: list[float] | None = None


_HOST_LABEL = re.compile(r"(?!-)[A-Za-z0-9-]{1,63}(?<!-)")


def _is_host(text: str) -> bool:
    """An IP address, or a DNS name of 1-63 character labels (RFC 1123)."""
    try:
        ipaddress.ip_address(text)
        return True
    except ValueError:
        pass
    labels = text.removesuffix(".").split(".")
    return len(text) <= 253 and all(_HOST_LABEL.fullmatch(label) for label in labels)


class BackendConfig(_Section):
    name: str = "model"
    engine: Literal["sglang", "vllm", "dflash"] = "sglang"
    engine_version: str | None = None
    host: str = "127.0.0.1"  # a host name or IP address the server binds and is reached at
    # None: the engine's own default (SGLang 30000, vLLM and serve 8000).
    port: int | None = Field(None, ge=1, le=65535)
    context_length: int | None = None
    extra_args: list[str] = []
    # Follow an engine's flag rename without a code change: logical key -> flag (null drops it).
    flag_overrides: dict[str, str | None] = {}
    # The command that starts the engine in place of its own (`vllm serve`, ...), e.g. a venv's
    # interpreter: [.venv-vllm/bin/python, -m, vllm.entrypoints.openai.api_server].
    launcher: list[str] = []
    env: dict[str, str] = {}  # for the server, and printed before its command by `best`
    # cpu: the engine's CPU build (vLLM's: no CUDA graphs, KV cache sized by kv_cache_gib).
    device: Literal["cuda", "cpu"] = "cuda"
    kv_cache_gib: float | None = Field(None, gt=0)
    # The model backend's constants (names: backends/perf_model/constants.py Efficiency), over
    # the shipped global fit for this GPU (backends/perf_model/fitted.yaml); `dflash-tune
    # calibrate --study NAME --write` stores a study's own fit here.
    efficiency: dict[str, float] = {}
    # The model backend prices GEMMs, experts, attention and collectives from the GPU's measured
    # kernel tables (docs/ARCHITECTURE.md) instead of the fitted roofline; None: wherever the
    # GPU has them (wiring.measured_kernels).
    measured_kernels: bool | None = None
    simulation: SimulationConfig = SimulationConfig()

    @field_validator("host")
    @classmethod
    def _host(cls, value: str) -> str:
        if not _is_host(value):
            raise ValueError("must be a host name or an IP address (no scheme, port or path), "
                             "e.g. 127.0.0.1 or node1.example.com")
        return value


class GatesConfig(_Section):
    """What a winner must pass before `best` names it (backends that run a model)."""

    probe_prompts: int = Field(8, ge=0)  # greedy outputs compared with the baseline's; 0: off
    probe_tokens: int = Field(32, ge=1)
    # Prompts whose greedy output may differ from the baseline's (bf16 near-ties flip tokens).
    probe_mismatches_allowed: int = Field(1, ge=0)
    # A speculative winner must average more tokens per round than this (1.0: the drafter
    # contributes nothing, e.g. weights loaded under the wrong algorithm).
    min_accept_len: float = Field(1.1, ge=1.0)
    soak_s: float = Field(300.0, ge=0.0)  # sustained load at the SLA limit; 0: off


class TuningConfig(_Section):
    """How `run` spends launches (see docs/TUNING.md)."""

    # tpe: one launch per sampled trial. launch_aware: the model screens, each launch finds its
    # own SLA limit, finalists are re-measured in fresh launches and gated.
    strategy: Literal["tpe", "launch_aware"] = "tpe"
    launches: int = Field(24, ge=2)  # launch budget of launch_aware, repeats and gates included
    per_round: int = Field(4, ge=1)  # launches per exploration round, between recalibrations
    screen_samples: int = Field(1500, ge=10)  # model evaluations per screening round
    finalists: int = Field(4, ge=1)
    # Fresh launches a configuration needs before `best` may choose it (measuring backends;
    # the performance model is exact and needs one).
    repeats: int = Field(3, ge=1)
    mad_penalty: float = Field(1.0, ge=0.0)
    noise_prior: float = Field(0.2, ge=0.0)  # relative SD assumed before repeats show it
    # Requests per level: short windows search the SLA limit, a long one measures the winner.
    long_window_factor: float = Field(4.0, ge=1.0)
    # The performance model: after the sampled trials, each family's best configuration at each
    # concurrency level is walked through single-knob changes, so that the crossover `best`
    # shows does not depend on what the sampler happened to try (tuner/level_search.py).
    level_search: bool = True
    gates: GatesConfig = GatesConfig()


# Backends that launch a server speak exactly one engine's flags.
SERVER_ENGINES = {"sglang": "sglang", "vllm": "vllm", "serve": "dflash"}


class Config(_Section):
    study: StudyConfig = StudyConfig()
    hardware: HardwareConfig = HardwareConfig()
    model: ModelSection = ModelSection()
    drafter: DrafterSection | None = DrafterSection()
    workload: WorkloadConfig = WorkloadConfig()
    backend: BackendConfig = BackendConfig()
    tuning: TuningConfig = TuningConfig()
    search_space: str = "pcie8_kimi"

    @model_validator(mode="after")
    def _engine_matches_backend(self) -> Config:
        wanted = SERVER_ENGINES.get(self.backend.name)
        if wanted and self.backend.engine != wanted:
            raise ValueError(f"backend {self.backend.name!r} launches engine {wanted!r}; set "
                             f"backend.engine: {wanted}")
        return self

    @model_validator(mode="after")
    def _open_loop_needs_a_server(self) -> Config:
        if self.workload.request_rate is not None and self.backend.name == "inprocess":
            raise ValueError("workload.request_rate (an open loop of arrivals) needs a server "
                             "backend; inprocess measures closed loops only")
        return self


def load_config(path: Path | None, overrides: dict[str, Any] | None = None) -> Config:
    """Read ``path`` (or the embedded defaults when None), apply dotted-key CLI overrides.

    Every problem is reported at once: schema errors and names the catalogs lack."""
    raw = read_config_yaml(path) if path is not None else {}
    for dotted, value in (overrides or {}).items():
        if value is not None:
            _set_dotted(raw, dotted, value)
    try:
        cfg, errors = Config.model_validate(raw), []
    except ValidationError as err:
        cfg, errors = None, err.errors()
    lines = [f"{_loc(e['loc'])}: {_message(e)}" for e in errors]
    lines += catalog_problems(raw, Config(), {_loc(e["loc"]) for e in errors})
    if lines:
        where = f"{path}: " if path else ""
        raise ConfigError([where + line for line in lines])
    return cfg


def _set_dotted(raw: dict[str, Any], dotted: str, value: Any) -> None:
    *parents, leaf = dotted.split(".")
    node = raw
    for key in parents:
        node = node.setdefault(key, {})
    node[leaf] = value


def _loc(loc: tuple[Any, ...]) -> str:
    return ".".join(str(part) for part in loc) or "(root)"


def _message(error: dict[str, Any]) -> str:
    """Pydantic's message; a wrong type also shows what the file had (`true`, "8")."""
    if error["type"] == "value_error":  # our validators' own words, without pydantic's prefix
        return str(error["ctx"]["error"])
    if error["type"].endswith("_type") and not isinstance(error["input"], dict | list):
        return f"{error['msg']}, got {error['input']!r}"
    return error["msg"]
