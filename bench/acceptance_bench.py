"""Acceptance of the tiny trained pair on its held-out prompts (greedy, CPU).

What the drafter buys, in the shape the published curves have: mean acceptance length (tau,
bonus included) for DFlash at every block size up to the trained one, and for DDTree at block 8
over node budgets, with and without the spine. Also two checks that the numbers are real:
losslessness (every speculative run emits exactly the plain greedy tokens) and the anchor-slot
ablation (MASK in block slot 0 instead of the real anchor must collapse tau).

    python bench/acceptance_bench.py [--pair DIR] [--max-tokens 64] [--json OUT]
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from harness import Timer, arguments, host_line, save_json, table

from dflash_core import DFlashProposer, DraftInput, SamplingParams, Spec
from dflash_core.training.evaluate import held_out_prompts, load_pair, pair_engine
from dflash_core.training.pair import default_pair_dir, ensure_pair

BUDGETS = (1, 2, 4, 8, 16, 32, 64, 128)


class MaskedAnchorProposer(DFlashProposer):
    """The anchor-slot ablation: every block slot holds MASK, so the drafter never sees the real
    anchor token. (tests/dflash_core_tests/reference.py holds the same guard for test_tiny_pair;
    the tests' folder is not importable from here, and the package keeps no test-only code.)"""

    def propose(self, draft: DraftInput) -> torch.Tensor:
        draft.anchors = torch.full_like(draft.anchors, self.drafter.config.mask_token_id)
        return super().propose(draft)


def run(pair: Path, max_tokens: int) -> dict:
    target, drafter = load_pair(pair)
    prompts = held_out_prompts(pair)
    engine = pair_engine(target, drafter, prompts, max_tokens, max_tree_nodes=max(BUDGETS) + 1)
    greedy = SamplingParams(max_tokens=max_tokens)
    plain = engine.generate(prompts, greedy, Spec.none())
    block = drafter.config.block_size
    rows = [("plain", plain)]
    rows += [(f"dflash bs={bs}", engine.generate(prompts, greedy, Spec.dflash(bs)))
             for bs in range(2, block + 1)]
    for spine in (False, True):
        rows += [(f"ddtree bs={block} budget={b}{' spine' if spine else ''}",
                  engine.generate(prompts, greedy, Spec.ddtree(block, b, spine=spine)))
                 for b in BUDGETS]
    masked = pair_engine(target, drafter, prompts, max_tokens)
    masked.proposer = MaskedAnchorProposer(drafter, target)
    rows.append((f"dflash bs={block}, MASK in slot 0", masked.generate(prompts, greedy,
                                                                        Spec.dflash(block))))
    return {"rows": [_row(name, g, plain) for name, g in rows], "prompts": len(prompts),
            "max_tokens": max_tokens}


def _row(name: str, g, plain) -> dict:
    return {"config": name, "tau": round(g.stats.mean_acceptance, 3),
            "rounds": g.stats.rounds, "lossless": g.tokens == plain.tokens,
            "cpu_tok_s": round(g.stats.tokens_per_s, 1)}


def markdown(result: dict) -> str:
    return table(["configuration", "mean acceptance (tau)", "batch rounds", "== plain greedy",
                  "CPU tok/s (not a speed claim)"],
                 [[r["config"], r["tau"], r["rounds"], r["lossless"], r["cpu_tok_s"]]
                  for r in result["rows"]])


def main() -> None:
    parser = arguments(__doc__)
    parser.add_argument("--pair", type=Path, default=None)
    parser.add_argument("--max-tokens", type=int, default=64)
    args = parser.parse_args()
    pair = ensure_pair(args.pair or default_pair_dir())
    timer = Timer()
    result = run(pair, args.max_tokens) | {"seconds": round(timer.s)}
    print(markdown(result))
    print(f"\n{result['prompts']} held-out prompts x {result['max_tokens']} tokens, greedy, "
          f"{result['seconds']} s; {host_line()}", file=sys.stderr)
    save_json(args.json, result)


if __name__ == "__main__":
    main()
