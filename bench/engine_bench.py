"""dflash_core engine benchmark: does verify cost what the roofline says, and what do DFlash and
DDTree buy end to end? One script for every check; a short table on stdout, JSON with --json.

1. Copy bandwidth of the device (the roofline's denominator).
2. Verify cost vs tree size: one target forward over N nodes per request after a cached prefix
   of C tokens, for each (context, batch, N), relative to the N = 1 decode step, with the bytes
   it must move (weights + prefix KV, read once) over its time as achieved bandwidth.
3. End to end at batch 1: plain decoding vs DFlash vs DDTree with the oracle proposer at a set
   acceptance profile (default: per-depth top-1 0.86 at block 16, mean acceptance ~6.5, the
   published Qwen3-8B block-16 level), so speedups need no trained weights.
4. Speedup by batch (`--e2e-batches`, bench/by_batch.py): plain vs DFlash over 1, 4, 16, ...
   requests at once, the same oracle profile: does the gain fall as the batch grows?

Model shapes come from a config with random weights (speed does not depend on the values):
`tiny` (CPU, CI), `qwen3-8b`, `qwen3-30b-a3b`, and `kimi-slice` (bench/kimi_slice.py: Kimi
K2.6's real dimensions, 3 layers, INT4 experts; verify only, and on a CPU shapes and bytes
only, on the meta device). Verify runs with the reference attention and
with the fused kernels (`EngineConfig.fused_attention`); end to end with `--attention`. On a
GPU both also run as CUDA graphs (`EngineConfig.cuda_graphs`): verify as a captured forward,
end to end with every round replayed, with the host's share of a round (1 - replay alone /
round as served).

    python bench/engine_bench.py --shapes tiny                       # CPU, seconds
    python bench/engine_bench.py --shapes qwen3-8b --device cuda --dtype bfloat16 --json out.json
    python bench/engine_bench.py --shapes kimi-slice                 # CPU: shapes + bytes
    python bench/engine_bench.py --shapes qwen3-8b --parts by-batch --e2e-batches 1,4,16,64 \
        --e2e-context 1024 --json by_batch.json                      # GPU: the gain by batch
"""

from __future__ import annotations

import dataclasses
import sys
import traceback

import torch
from by_batch import by_batch
from engine_report import best_ddtree, print_tables
from harness import arguments, host_line, on_cuda, samples, save_json, stat, sync
from kimi_slice import build_kimi_slice

from dflash_core import (
    AcceptanceProfile,
    Engine,
    EngineConfig,
    ModelConfig,
    OracleProposer,
    SamplingParams,
    Spec,
    Target,
)
from dflash_core.models.int4 import Int4Experts
from dflash_core.models.layers import Experts
from dflash_core.models.step import Step
from dflash_core.runtime.graphs import capture, on_side_stream
from dflash_core.speculation.tree import chain_tree

SHAPES = {
    "tiny": dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, head_dim=16),
    "qwen3-8b": dict(vocab_size=151936, hidden_size=4096, intermediate_size=12288,
                     num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8,
                     head_dim=128),
    "qwen3-30b-a3b": dict(vocab_size=151936, hidden_size=2048, intermediate_size=6144,
                          num_hidden_layers=48, num_attention_heads=32, num_key_value_heads=4,
                          head_dim=128, num_experts=128, num_experts_per_tok=8,
                          moe_intermediate_size=768),
}
QUICK = dict(contexts=[64, 128], batches=[1, 2], nodes=[1, 4, 8, 16], tokens=160, block=8,
             budgets=[16, 32, 64], e2e_context=64, e2e_batches=[1, 3])
# The contexts; trees up to 128 nodes (the all-experts INT4 path from 48 tokens on).
KIMI_PLAN = dict(contexts=[1024, 4096, 16384], batches=[1], nodes=[1, 8, 16, 32, 64, 128])
FULL = dict(contexts=[1024, 4096, 16384], batches=[1, 4, 16], nodes=[1, 8, 16, 32, 64, 128, 256],
            tokens=256, block=16, budgets=[8, 16, 32, 64, 128], e2e_context=4096, e2e_batches=[])
PARTS = ("verify", "e2e", "by-batch")


def build_target(shape: str, device: str, dtype: torch.dtype, seed: int = 0) -> Target:
    if shape == "kimi-slice":
        return build_kimi_slice("meta" if device == "cpu" else device, dtype)
    torch.manual_seed(seed)
    with torch.device(device):
        previous = torch.get_default_dtype()
        torch.set_default_dtype(dtype)  # allocate in the target dtype: an fp32 8B would not fit
        try:
            target = Target(ModelConfig(**SHAPES[shape])).eval()
        finally:
            torch.set_default_dtype(previous)
    with torch.no_grad():
        for p in target.parameters():
            p.normal_(0, 0.02)
    return target


def timed(fn, device: str, repeats: int = 5) -> float:
    """Median seconds of fn() after one warm-up."""
    return stat(samples(fn, repeats, sync=lambda: sync(device))).median


def copy_bandwidth(device: str) -> float:
    """GB/s of a device-to-device copy (read + write)."""
    n = 64 * 2**20 if on_cuda(device) else 8 * 2**20
    src = torch.empty(n, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    seconds = timed(lambda: dst.copy_(src), device)
    return 2 * src.numel() * src.element_size() / seconds / 1e9


@torch.inference_mode()
def verify_cost(target: Target, contexts, batches, nodes, device: str) -> list[dict]:
    """Both attention kernels (reference matmuls, fused), each relative to its own decode."""
    return [row | {"attention": "fused" if fused else "reference"}
            for fused in (False, True)
            for row in _verify_cost(target, contexts, batches, nodes, device, fused)]


def bytes_moved(target: Target, batch: int, context: int, nodes: int) -> int:
    """What a verify must read once: the weights (of the routed experts only those its tokens
    route to; of an untied embedding table only its rows) and every row's prefix cache
    (per-head K/V, or MLA's latents)."""
    weights = sum(t.numel() * t.element_size()
                  for t in (*target.parameters(), *target.buffers()))
    embed = target.model.embed_tokens.weight
    if not target.config.tie_word_embeddings:
        weights -= (embed.shape[0] - batch * nodes) * embed.shape[1] * embed.element_size()
    for reach, per_expert, experts in experts_reached(target, batch * nodes):
        weights -= round((experts - reach) * per_expert)
    cache = target.allocate_cache(1, 1)
    per_token = sum(getattr(cache, f.name).numel() * getattr(cache, f.name).element_size()
                    for f in dataclasses.fields(cache))
    return weights + batch * context * per_token


def experts_reached(target: Target, tokens: int) -> list[tuple[float, int, int]]:
    """(experts a forward of `tokens` tokens reads, bytes per expert, experts) per routed MoE
    block, INT4 or not. The reach is the expected count under uniform routing, which random
    weights give: E (1 - (1 - k/E)^tokens), k at one token, all E only in the limit."""
    out = []
    top_k = target.config.num_experts_per_tok
    for module in target.modules():
        if isinstance(module, (Int4Experts, Experts)):
            experts = module.num_experts
            per_expert = sum(t.numel() * t.element_size()
                             for t in (*module.parameters(), *module.buffers())) // experts
            reach = experts * (1 - (1 - top_k / experts) ** tokens)
            out.append((reach, per_expert, experts))
    return out


def _verify_cost(target: Target, contexts, batches, nodes, device: str,
                 fused: bool) -> list[dict]:
    if target.lm_head.weight.is_meta:
        return _verify_shapes(target, contexts, batches, nodes, fused)
    rows = []
    for context in contexts:
        for batch in batches:
            cache = target.allocate_cache(batch, context + max(nodes))
            decode = None
            for n in nodes:
                def forward(cache=cache, batch=batch, context=context, n=n) -> None:
                    _verify(target, cache, batch, context, n, device, fused)

                seconds = timed(forward, device)
                graphed = guarded(lambda f=forward: timed(graph_of(f), device), device)
                decode = decode or (seconds, graphed)
                moved = bytes_moved(target, batch, context, n)
                rows.append({"context": context, "batch": batch, "nodes": n,
                             "gb_moved": round(moved / 1e9, 3),
                             "ms": round(seconds * 1e3, 3), "vs_decode": round(seconds / decode[0], 3),
                             "achieved_gb_s": round(moved / seconds / 1e9, 1)}
                            | _graph_columns(graphed, decode[1], moved))
    return rows


def _verify_shapes(target: Target, contexts, batches, nodes, fused: bool) -> list[dict]:
    """Meta device: each verify runs for its shapes (logits [B, N, V] checked), nothing timed."""
    rows = []
    for context in contexts:
        for batch in batches:
            cache = target.allocate_cache(batch, context + max(nodes))
            for n in nodes:
                logits = _verify(target, cache, batch, context, n, "meta", fused)
                assert logits.shape == (batch, n, target.config.vocab_size), logits.shape
                rows.append({"context": context, "batch": batch, "nodes": n, "ms": None,
                             "vs_decode": None, "achieved_gb_s": None,
                             "gb_moved": round(bytes_moved(target, batch, context, n) / 1e9, 3)}
                            | _graph_columns(None, None, 0))
    return rows


GRAPH_ERRORS: list[str] = []  # the first failure turns the graph columns off, not the run


def guarded(graph_work, device: str):
    """graph_work() on a GPU while no graph work has failed; None otherwise (and on failure,
    which is recorded): a scarce GPU run keeps its eager numbers whatever the graphs do."""
    if not on_cuda(device) or GRAPH_ERRORS:
        return None
    try:
        return graph_work()
    except Exception as error:  # noqa: BLE001 - reported in the output, not raised
        GRAPH_ERRORS.append(f"{type(error).__name__}: {error}")
        traceback.print_exc()  # where it failed, on stderr (the JSON keeps the message)
        return None


def _graph_columns(seconds: float | None, decode: float | None, moved: int) -> dict:
    if seconds is None:
        return {"graph_ms": None, "graph_vs_decode": None, "graph_gb_s": None}
    return {"graph_ms": round(seconds * 1e3, 3), "graph_vs_decode": round(seconds / decode, 3),
            "graph_gb_s": round(moved / seconds / 1e9, 1)}


def graph_of(fn):
    """fn captured in a CUDA graph (after a warm-up on a side stream); returns its replay."""
    on_side_stream(fn)
    return capture(fn).replay


def _verify(target: Target, cache, batch: int, context: int, n: int, device: str,
            fused: bool) -> torch.Tensor:
    starts = torch.full((batch,), context, dtype=torch.long, device=device)
    anchors = torch.zeros(batch, dtype=torch.long, device=device)
    tree = chain_tree(anchors, torch.ones(batch, n - 1, dtype=torch.long, device=device))
    step = Step(starts[:, None] + tree.depths, starts[:, None] + torch.arange(n, device=device),
                starts, context, tree.mask, fused)
    hidden, _ = target(tree.tokens, step, cache)
    return target.logits(hidden)


@torch.inference_mode()
def end_to_end(target: Target, context: int, tokens: int, block: int, budgets: list[int],
               top1: float, device: str, fused: bool,
               rows: list[dict] | None = None, measured=lambda: None) -> list[dict]:
    """Eager: tok/s from rounds with no per-stage sync (one sync a round, as served), per-stage
    ms from a second run that syncs at every stage boundary. Graphs (GPU): tok/s with every
    round replayed, after a full warm-up run that captured every round shape. Each row goes
    into `rows` as it is measured, then `measured()` is called (a run cut short keeps them)."""
    prompt = [[int(t) for t in torch.randint(1, 500, (context,))]]
    limits = dict(max_batch=1, max_context=context + tokens + block + 2,
                  max_tree_nodes=max(budgets) + 1)

    def engine(proposer, timing: bool, graphs: bool = False) -> Engine:
        return Engine(target, proposer, EngineConfig(**limits, stage_timing=timing,
                                                     fused_attention=fused, cuda_graphs=graphs))

    plain = engine(None, False)
    plain.generate(prompt, SamplingParams(max_tokens=4))  # warm-up
    reference = plain.generate(prompt, SamplingParams(max_tokens=tokens + block))
    oracle = OracleProposer([prompt[0] + reference.tokens[0]], target.config.vocab_size, block,
                            AcceptanceProfile.constant(block - 1, top1, (1 - top1) / 2))
    proposers = {"plain": None} | {name: oracle for name in ("dflash", "ddtree")}
    specs = {"plain": Spec.none(), f"dflash b{block}": Spec.dflash(block)}
    specs |= {f"ddtree b{block} budget {b}": Spec.ddtree(block, b) for b in budgets}
    sampling = SamplingParams(max_tokens=tokens)
    rows = [] if rows is None else rows
    for mode in ("eager", "graphs") if on_cuda(device) else ("eager",):
        base = None
        for name, spec in specs.items():
            proposer = proposers[name.split()[0]]
            if mode == "eager":
                row = _eager_run(engine(proposer, False), engine(proposer, True), prompt,
                                 sampling, spec, device)
            else:
                row = guarded(lambda p=proposer, s=spec: _graph_run(
                    engine(p, True, graphs=True), prompt, sampling, s), device)
                if row is None:
                    break
            base = base or row["tok_s"]
            rows.append({"method": name, "mode": mode, **row,
                         "speedup": round(row["tok_s"] / base, 2)})
            measured()
    return rows


def _eager_run(fast: Engine, staged: Engine, prompt, sampling, spec, device: str) -> dict:
    fast.generate(prompt, SamplingParams(max_tokens=8), spec)  # warm-up
    sync(device)
    result = fast.generate(prompt, sampling, spec)
    stats = staged.generate(prompt, sampling, spec).stats
    stages = {k: round(stats.stage_s[k] / max(stats.rounds, 1) * 1e3, 3)
              for k in ("draft", "build", "verify", "commit")}
    return {"tok_s": round(result.stats.tokens_per_s, 1),
            "tau": round(result.stats.mean_acceptance, 2), "ms_per_round": stages,
            "host_share": None}


def _graph_run(engine: Engine, prompt, sampling, spec) -> dict:
    """Round time as served (wall minus the synced prefill, per round) against the replay of
    the last round's graph alone: the difference is the host's work between replays."""
    engine.generate(prompt, sampling, spec)  # captures every shape this run meets
    sync("cuda")
    result = engine.generate(prompt, sampling, spec)
    stats = result.stats
    round_s = (stats.wall_s - stats.stage_s["prefill"]) / max(stats.rounds, 1)
    graphs = engine.open_batch(spec, rows=1).round.graphs
    replay_s = timed(list(graphs.graphs.values())[-1].replay, "cuda", repeats=20)
    return {"tok_s": round(stats.tokens_per_s, 1), "tau": round(stats.mean_acceptance, 2),
            "ms_per_round": {"round": round(round_s * 1e3, 3),
                             "replay": round(replay_s * 1e3, 3)},
            "host_share": round(max(0.0, 1 - replay_s / round_s), 3)}


def main() -> None:
    parser = arguments(__doc__, seed=0)
    parser.add_argument("--shapes", choices=sorted([*SHAPES, "kimi-slice"]), default="tiny")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default=None, help="default: bfloat16 on cuda, float32 on cpu")
    parser.add_argument("--top1", type=float, default=0.86)
    parser.add_argument("--attention", choices=("fused", "reference"), default="fused",
                        help="attention kernels of the end-to-end runs (verify runs both)")
    for name in ("contexts", "batches", "nodes", "budgets"):
        parser.add_argument(f"--{name}", type=_ints, default=None,
                            help=f"comma-separated, instead of the plan's {name}")
    parser.add_argument("--e2e-context", type=int, default=None,
                        help="prompt tokens of the end-to-end runs (plan: 4096; tiny: 64)")
    parser.add_argument("--e2e-batches", type=_ints, default=None,
                        help="batch sizes of the speedup-by-batch runs (plan: tiny 1,3; else none)")
    parser.add_argument("--parts", type=_parts, default=PARTS,
                        help=f"comma-separated, which of {', '.join(PARTS)} to run (default: all)")
    args = parser.parse_args()
    plan = dict(QUICK if args.shapes == "tiny" else FULL)
    if args.shapes == "kimi-slice":
        plan |= KIMI_PLAN
    plan |= {k: getattr(args, k) for k in ("contexts", "batches", "nodes", "budgets", "e2e_context",
                                           "e2e_batches") if getattr(args, k)}
    # The Kimi slice is BF16 + INT4 as served; on a CPU it is only counted (meta device).
    cpu_default = "bfloat16" if args.shapes == "kimi-slice" else "float32"
    dtype = getattr(torch, args.dtype or ("bfloat16" if args.device != "cpu" else cpu_default))
    target = build_target(args.shapes, args.device, dtype, args.seed)
    result = {"shapes": args.shapes, "device": args.device, "dtype": str(dtype),
              "torch": torch.__version__, "copy_gb_s": round(copy_bandwidth(args.device), 1),
              "end_to_end_attention": args.attention, "end_to_end_context": plan["e2e_context"],
              "graph_errors": GRAPH_ERRORS}
    result["verify"] = (verify_cost(target, plan["contexts"], plan["batches"], plan["nodes"],
                                    args.device) if "verify" in args.parts else [])
    for row in result["verify"]:  # the roofline: bytes that must move at the copy bandwidth
        row["of_copy"] = row["achieved_gb_s"] and round(row["achieved_gb_s"] / result["copy_gb_s"],
                                                        3)
        row["graph_of_copy"] = row["graph_gb_s"] and round(row["graph_gb_s"] / result["copy_gb_s"], 3)
    save_json(args.json, result)  # a run cut short keeps what it measured
    rows = result["end_to_end"] = []
    batched = result["by_batch"] = []

    def measured(rows=rows, what="end to end") -> None:  # a run cut short keeps each row
        save_json(args.json, result)
        row = rows[-1]
        print(f"{what}: {row['method']}, {row['mode']}: {row['tok_s']} tok/s", file=sys.stderr)

    e2e = (target, plan["e2e_context"], plan["tokens"], plan["block"])
    fused = args.attention == "fused"
    if args.shapes != "kimi-slice" and "e2e" in args.parts:  # the slice has no drafter
        end_to_end(*e2e, plan["budgets"], args.top1, args.device, fused, rows, measured)
    if args.shapes != "kimi-slice" and "by-batch" in args.parts:
        by_batch(*e2e, args.top1, args.device, fused, plan["e2e_batches"], batched,
                 lambda: measured(batched, f"batch {batched[-1]['batch']}"))
    result["best_ddtree"] = best_ddtree(result["end_to_end"])
    save_json(args.json, result)
    print_tables(result)
    print(host_line(), file=sys.stderr)


def _ints(text: str) -> list[int]:
    return [int(v) for v in text.split(",") if v.strip()]


def _parts(text: str) -> tuple[str, ...]:
    parts = tuple(v.strip() for v in text.split(",") if v.strip())
    unknown = [p for p in parts if p not in PARTS]
    if unknown:
        raise ValueError(f"unknown parts {unknown}: choose from {', '.join(PARTS)}")
    return parts


if __name__ == "__main__":
    main()
