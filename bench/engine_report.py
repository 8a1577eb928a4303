"""Tables and summaries of bench/engine_bench.py's result (a dict, also its JSON)."""

from __future__ import annotations


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


def print_tables(result: dict) -> None:
    print(f"{result['shapes']} on {result['device']} ({result['dtype']}), "
          f"copy bandwidth {result['copy_gb_s']} GB/s")
    print("\nGB/s = (weights + prefix KV, read once) / time; roof = that / copy bandwidth")
    print("attention  context batch nodes GB_moved       ms vs_decode    GB/s  roof   graph_ms "
          "graph_vs_decode graph_GB/s graph_roof")
    for r in result["verify"]:
        print(f"{r['attention']:<10} {r['context']:>7} {r['batch']:>5} {r['nodes']:>5} "
              f"{r['gb_moved']:>8} {_cell(r['ms']):>8} {_cell(r['vs_decode']):>9} "
              f"{_cell(r['achieved_gb_s']):>7} {_cell(r['of_copy']):>5} "
              f"{_cell(r['graph_ms']):>10} {_cell(r['graph_vs_decode']):>15} "
              f"{_cell(r['graph_gb_s']):>10} {_cell(r['graph_of_copy']):>10}")
    if not result["end_to_end"]:
        return
    print(f"\nend to end, batch 1, {result['end_to_end_context']}-token prompt, "
          f"{result['end_to_end_attention']} attention")
    print("method                     mode       tok/s  speedup   tau  host  ms per round "
          "(eager: draft/build/verify/commit; graphs: round/replay)")
    for r in result["end_to_end"]:
        stages = "/".join(str(v) for v in r["ms_per_round"].values())
        print(f"{r['method']:<26} {r['mode']:<7} {r['tok_s']:>8} {r['speedup']:>7} "
              f"{r['tau']:>6} {_cell(r['host_share']):>5}  {stages}")
    for mode, best in result["best_ddtree"].items():
        print(f"best DDTree ({mode}): {best['method']}, {best['vs_dflash']}x DFlash")
    for error in result["graph_errors"]:
        print(f"CUDA graphs failed, their columns are empty: {error}")


def _cell(value) -> str:
    return "-" if value is None else str(value)
