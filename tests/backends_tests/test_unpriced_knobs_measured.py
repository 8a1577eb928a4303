"""The launch-aware strategy against a fake SGLang on a PCIe node without peer-to-peer access
(fake_servers/fake_engine.py: NCCL beats the custom all-reduce there, and LL128 beats NCCL's own
choice), where only a measurement can tell the all-reduce settings apart: the study launches
the leader with each value of those knobs, finds the fast path, and `best` emits it and says
that the model could not price it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import psutil
import yaml
from fake_servers.fake_backends import FakeSGLangBackend

from backends import Deployment
from backends.flags import LaunchTarget
from dflash_core.training.pair import ensure_pair
from tuner.config import load_config
from tuner.launches.run import build

PAIR = ensure_pair()
REPO = Path(__file__).resolve().parents[2]
# The tiny pair's model and drafter sections, as the serve example gives them.
EXAMPLE = yaml.safe_load((REPO / "docs" / "examples" / "serve-tiny-pair.yaml").read_text())
SPACE = {
    "name": "fake_pcie", "description": "TP2 on a PCIe node: speculation and the all-reduce path",
    "context": {"measured": "a real engine runs the trials", "gpus": "GPUs on the node"},
    "params": {
        "tp_size": {"type": "categorical", "choices": [2]},
        "speculative_algorithm": {"type": "categorical", "choices": ["none", "dflash"]},
        "speculative_dflash_block_size": {"type": "categorical", "choices": [8],
                                          "when": "speculative_algorithm != 'none'"},
        "disable_custom_all_reduce": {"type": "categorical", "choices": [False, True],
                                      "when": "measured"},
        "nccl_proto": {"type": "categorical", "choices": [None, "LL", "LL128", "Simple"],
                       "when": "measured"},
        "cuda_graph": {"type": "categorical", "choices": [False]},
        "max_running_requests": {"type": "categorical", "choices": [4]},
    },
}


def _study(folder) -> dict:
    (folder / "space.yaml").write_text(yaml.safe_dump(SPACE))
    return {
        "study": {"name": "fake-pcie", "storage": f"sqlite:///{folder / 'results.db'}",
                  "seed": 0},
        "hardware": {"gpus": 2},
        "model": {k: str(REPO / v) for k, v in EXAMPLE["model"].items()},
        "drafter": {**EXAMPLE["drafter"], "path": str(REPO / EXAMPLE["drafter"]["path"])},
        "workload": {"input_len": 16, "output_len": 24, "concurrency": [1, 2],
                     "target_concurrency": 2, "sla": []},
        # The roofline screens: it prices neither knob (the measured tables time the custom
        # all-reduce with peer-to-peer access, which this node lacks).
        "backend": {"name": "sglang", "engine": "sglang", "context_length": 256,
                    "measured_kernels": False},
        "search_space": str(folder / "space.yaml"),
        # Launches enough for the whole walk: LL, Simple and NCCL's own choice are equally fast
        # here, so noise can move the lead among them, and each move costs a launch.
        "tuning": {"strategy": "launch_aware", "launches": 16, "per_round": 2,
                   "finalists": 2, "repeats": 1, "screen_samples": 100,
                   "gates": {"probe_prompts": 0, "soak_s": 0}},
    }


def test_the_study_measures_what_the_model_cannot_price_and_best_says_so(tmp_path):
    config = tmp_path / "tuner.yaml"
    config.write_text(yaml.safe_dump(_study(tmp_path)))
    cfg = load_config(config)
    node = Deployment(gpu="fake", gpus=2, model=str(PAIR / "target"),
                      target=LaunchTarget(str(PAIR / "target"), str(PAIR / "drafter")))
    backend = FakeSGLangBackend(node, requests_per_level=4, warmup_requests=1,
                                start_timeout_s=60.0)
    backend.tokens_per_s = 100.0  # a stream of 24 tokens takes ~0.24 s: speed shows over noise
    strategy = build(cfg, backend=backend)
    outcome = strategy.run()
    assert [p for p in psutil.Process().children(recursive=True) if p.status() != "zombie"] == []

    launched = [x.params for x in strategy.launcher.launches]
    # The model proposed each configuration it can price once, at the engine's defaults ...
    proposed = launched[:2]
    assert [p["speculative_algorithm"] for p in proposed] == ["none", "dflash"]
    assert all(not p["disable_custom_all_reduce"] and p["nccl_proto"] is None for p in proposed)
    # ... then the leader was launched with each other value of each knob it cannot price.
    assert any(p["disable_custom_all_reduce"] and p["nccl_proto"] is None for p in launched)
    tried = {p["nccl_proto"] for p in launched if p["disable_custom_all_reduce"]}
    assert tried == {None, "LL", "LL128", "Simple"}
    winner = outcome.winner.params
    assert winner["disable_custom_all_reduce"] and winner["nccl_proto"] == "LL128"

    best = _tuner("best", "--format", "json", "-c", str(config), cwd=tmp_path)
    chosen = json.loads(best.stdout)
    assert chosen["measured_only"] == {"disable_custom_all_reduce": True, "nccl_proto": "LL128"}
    assert chosen["env"] == {"NCCL_PROTO": "LL128"}
    assert "--disable-custom-all-reduce" in chosen["argv"]
    said = _tuner("best", "-c", str(config), cwd=tmp_path).stderr
    assert "measured only: disable_custom_all_reduce=True, nccl_proto=LL128" in said
    assert "predicted only" not in said


def _tuner(*args: str, cwd) -> subprocess.CompletedProcess:
    run = subprocess.run([sys.executable, "-m", "tuner", *args], cwd=cwd, capture_output=True,
                         text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    return run
