"""A search space of serving knobs only, for tests of which configurations a study measures.

It has no ``speculative_algorithm``, so the enqueued baseline draws every parameter like any
other trial: a second sampler on the study's own seed would replay the first one's samples one
for one. The continuous parameter keeps chance repeats out."""

from __future__ import annotations

from pathlib import Path

PLAIN_SPACE = """name: plain
description: serving knobs only, plain decoding
context: {gpus: GPUs on the node}
params:
  tp_size: {type: categorical, choices: [4, 8]}
  dp_size: {derive: "gpus // tp_size"}
  max_running_requests: {type: int, low: 8, high: 256}
  mem_fraction_static: {type: float, low: 0.80, high: 0.92}
"""


def write_plain_space(folder: Path) -> Path:
    path = folder / "plain.yaml"
    path.write_text(PLAIN_SPACE)
    return path
