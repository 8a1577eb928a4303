"""What the measured kernel tables say an 8-bit KV cache costs: FP8-cache time over bf16-cache
time of one decode attention layer, per GPU system, engine and kernel family.

For each system (the RTX PRO 6000 server, H200, B200) and each decode attention table (GQA under
SGLang and vLLM, SGLang's absorbed MLA, vLLM's whole MLA block), the ratio at 8 query heads a
rank (16 for vLLM's MLA block, DeepSeek-V3's geometry, bf16 GEMMs) over 8 and 64 requests of
4,096 and 16,384 cached tokens; the table prints each cell's range. Rows the model leaves out
(kernels/tables.CONTRADICTED) are read too, and marked. Needs `pip install -e '.[aiconfigurator]'`.

    python bench/kv_cache_tables.py [--json PATH]
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness import arguments, host_line, save_json, table  # noqa: E402

from backends.perf_model.kernels.tables import (  # noqa: E402
    contradicted,
    rows_grid,
    table_path,
)

SYSTEMS = ("rtx_pro_6000_server", "h200_sxm", "b200_sxm")
BATCHES, CONTEXTS = (8, 64), (4096, 16384)
AXES = ("num_heads", "batch_size", "step")
# column -> (family, engine, file, the rows' other columns, query heads a rank)
FAMILIES = {
    "GQA, SGLang": ("attention", "sglang", "generation_attention_perf.parquet",
                    {"head_dim": 128, "num_key_value_heads": 1, "window_size": 0}, 8),
    "GQA, vLLM": ("attention", "vllm", "generation_attention_perf.parquet",
                  {"head_dim": 128, "num_key_value_heads": 1, "window_size": 0}, 8),
    "MLA, SGLang": ("mla", "sglang", "generation_mla_perf.parquet", {}, 8),
    "MLA block, vLLM": ("mla", "vllm", "mla_generation_module_perf.parquet",
                        {"gemm_type": "bfloat16", "model": "deepseek-ai/DeepSeek-V3"}, 16),
}


def ratios(system: str, family: str, engine: str, file: str, where: dict,
           heads: int) -> list[float] | None:
    """FP8 over bf16 at every (batch, context), or None where no FP8 row was timed."""
    path = table_path(system, family, engine, file)
    if path is None:
        return None
    grids = [rows_grid(path, tuple(sorted({**where, "kv_cache_dtype": kv}.items())), AXES)
             for kv in ("fp8", "bfloat16")]
    if None in grids:
        return None
    fp8, bf16 = grids
    return [fp8.at((heads, b, c), ()) / bf16.at((heads, b, c), ())
            for b in BATCHES for c in CONTEXTS]


def cell(system: str, spec: tuple) -> str:
    family, engine, file, where, heads = spec
    found = ratios(system, family, engine, file, where, heads)
    if found is None:
        return "not timed"
    fp8_rows = {**where, "kv_cache_dtype": "fp8"}
    left_out = " (left out)" * bool(contradicted(system, engine, file, fp8_rows))
    return f"{min(found):.2f}-{max(found):.2f}{left_out}"


def main() -> int:
    args = arguments(__doc__).parse_args()
    rows = [[system] + [cell(system, spec) for spec in FAMILIES.values()] for system in SYSTEMS]
    print(table(["FP8 / bf16 cache", *FAMILIES], rows))
    print(host_line(), file=sys.stderr)
    save_json(args.json, {"columns": list(FAMILIES), "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
