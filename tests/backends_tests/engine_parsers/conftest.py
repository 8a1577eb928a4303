"""The engines' own argument parsers (SGLang 0.5.23, vLLM 0.33.0) in .venv-parsers
(scripts/install_engine_parsers.sh), marked `parsers`: the README's test command leaves them
out; `.ci/run` installs the venv and runs them (`pytest -m parsers`). Where the venv is missing
they skip, except in CI, where they must run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[3]
PROBE = Path(__file__).with_name("engine_probe.py")
# A Kimi K2.6-like target (DeepSeek-V3 layout) and its block-8 DFlash drafter: the config.json
# the engines read; no weights, no tokenizer.
KIMI = {
    "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
    "vocab_size": 163840, "hidden_size": 7168, "intermediate_size": 18432,
    "moe_intermediate_size": 2048, "num_hidden_layers": 61, "num_attention_heads": 64,
    "num_key_value_heads": 64, "n_shared_experts": 1, "n_routed_experts": 384,
    "num_experts_per_tok": 8, "first_k_dense_replace": 1, "moe_layer_freq": 1,
    "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
    "v_head_dim": 128, "n_group": 1, "topk_group": 1, "topk_method": "noaux_tc",
    "scoring_func": "sigmoid", "routed_scaling_factor": 2.827, "norm_topk_prob": True,
    "max_position_embeddings": 262144, "rope_theta": 50000.0, "rms_norm_eps": 1e-5,
    "hidden_act": "silu", "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    "bos_token_id": 163584, "eos_token_id": 163585,
}
DRAFTER = {
    "architectures": ["DFlashDraftModel"], "model_type": "qwen3", "vocab_size": 163840,
    "hidden_size": 7168, "intermediate_size": 18432, "num_hidden_layers": 6,
    "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 128,
    "rms_norm_eps": 1e-5, "rope_theta": 50000.0, "max_position_embeddings": 262144,
    "hidden_act": "silu", "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    "block_size": 8, "num_target_layers": 61,
    "dflash_config": {"target_layer_ids": [1, 12, 24, 35, 47, 58], "mask_token_id": 163838},
}


@pytest.fixture(scope="session")
def parsers_python() -> Path:
    python = REPO / os.environ.get("PARSERS_VENV", ".venv-parsers") / "bin" / "python"
    if not python.exists():
        message = f"the engines' parsers are not in {python.parents[1]}: run " \
                  "scripts/install_engine_parsers.sh"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return python


@pytest.fixture(scope="session")
def checkpoints(tmp_path_factory) -> tuple[Path, Path]:
    """(target, drafter): local checkpoint dirs of config.json only."""
    root = tmp_path_factory.mktemp("checkpoints")
    for name, config in (("Kimi-K2.6", KIMI), ("Kimi-K2.6-DFlash", DRAFTER)):
        (root / name).mkdir()
        (root / name / "config.json").write_text(json.dumps(config))
    return root / "Kimi-K2.6", root / "Kimi-K2.6-DFlash"


@pytest.fixture(scope="session")
def probe(parsers_python, tmp_path_factory):
    """Checks requests ({engine, argv, env}) in one run of engine_probe.py; its verdicts."""
    home = tmp_path_factory.mktemp("probe-home")  # the engines' caches go here, not in ~

    def run(requests: list[dict[str, Any]]) -> list[dict[str, Any]]:
        env = {**os.environ, "HOME": str(home), "XDG_CACHE_HOME": str(home / ".cache")}
        done = subprocess.run([str(parsers_python), str(PROBE)], input=json.dumps(requests),
                              capture_output=True, text=True, cwd=REPO, env=env, timeout=600)
        if done.returncode:
            sys.stderr.write(done.stderr[-4000:])
            raise AssertionError(f"engine_probe.py exited {done.returncode}")
        return json.loads(done.stdout)

    return run
