"""Tables and summaries of bench/engine_bench.py's result (a dict, also its JSON)."""

from __future__ import annotations

from harness import table


def best_ddtree(rows: list[dict]) -> dict:
    """Per mode: the DDTree budget with the most tok/s and its ratio to DFlash's."""
    best = {}
    for mode in dict.fromkeys(r["mode"] for r in rows):
        mine = [r for r in rows if r["mode"] == mode]
        dflash = [r for r in mine if r["method"].startswith("dflash")]
        trees = [r for r in mine if r["method"].startswith("ddtree")]
        if not dflash or not trees:  # a mode cut short (graphs that failed)
            continue
        dflash, tree = dflash[0], max(trees, key=lambda r: r["tok_s"])
        best[mode] = {"method": tree["method"],
                      "vs_dflash": round(tree["tok_s"] / dflash["tok_s"], 2)}
    return best


VERIFY = ["attention", "context", "batch", "nodes", "GB_moved", "ms", "vs_decode", "GB/s", "roof",
          "graph_ms", "graph_vs_decode", "graph_GB/s", "graph_roof"]
VERIFY_KEYS = ["attention", "context", "batch", "nodes", "gb_moved", "ms", "vs_decode",
               "achieved_gb_s", "of_copy", "graph_ms", "graph_vs_decode", "graph_gb_s",
               "graph_of_copy"]


def print_tables(result: dict) -> None:
    print(f"{result['shapes']} on {result['device']} ({result['dtype']}), "
          f"copy bandwidth {result['copy_gb_s']} GB/s")
    if result["verify"]:
        print("\nverify: GB/s = (weights + prefix KV, read once) / time; "
              "roof = that / copy bandwidth")
        print(table(VERIFY, [[r[k] for k in VERIFY_KEYS] for r in result["verify"]]))
    if result["end_to_end"]:
        _end_to_end(result)
    if result["by_batch"]:
        print(f"\nspeedup by batch, {result['end_to_end_context']}-token prompts, "
              f"{result['end_to_end_attention']} attention, rounds while every request runs; "
              "at profile = the profile's chain tau over the round's cost vs plain")
        print(table(["batch", "method", "mode", "tok/s", "tau", "ms/round", "rounds", "speedup",
                     "round vs plain", "speedup at profile"],
                    [[r["batch"], r["method"], r["mode"], r["tok_s"], r["tau"],
                      r["ms_per_round"], r["rounds"], r.get("speedup", 1.0),
                      r.get("round_vs_plain", 1.0), r.get("speedup_at_profile", 1.0)]
                     for r in result["by_batch"]]))
    for error in result["graph_errors"]:
        print(f"CUDA graphs failed, their columns are empty: {error}")


def _end_to_end(result: dict) -> None:
    print(f"\nend to end, batch 1, {result['end_to_end_context']}-token prompt, "
          f"{result['end_to_end_attention']} attention; ms per round: eager "
          "draft/build/verify/commit, graphs round/replay")
    print(table(["method", "mode", "tok/s", "speedup", "tau", "host", "ms per round"],
                [[r["method"], r["mode"], r["tok_s"], r["speedup"], r["tau"], r["host_share"],
                  "/".join(str(v) for v in r["ms_per_round"].values())]
                 for r in result["end_to_end"]]))
    for mode, best in result["best_ddtree"].items():
        print(f"best DDTree ({mode}): {best['method']}, {best['vs_dflash']}x DFlash")
