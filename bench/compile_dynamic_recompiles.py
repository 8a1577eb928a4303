"""Why `dynamic=True` did not work: Dynamo graphs and recompiles of the old `--compile` path.

The verify forward as issue 18's first compile pass wrapped it (a closure over (ids, step,
cache), `dynamic=True`), traced by Dynamo only (backend "eager", no Inductor: seconds), through
plain-decoding rounds with exact prefix reads. Run with TORCH_LOGS=recompiles to see the guard
each recompile failed (it was `step.read_len == 64`, from the bias memo's dict key in
attention.attend).

    OMP_NUM_THREADS=1 TORCH_LOGS=recompiles python bench/compile_dynamic_recompiles.py [--batch 8]
"""

from __future__ import annotations

import argparse
import json

import torch
from torch._dynamo.utils import counters

from dflash_core import SamplingParams, Spec, build_engine, load_models
from dflash_core.training.pair import ensure_pair


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--tokens", type=int, default=24)
    args = parser.parse_args()
    torch.set_num_threads(1)
    pair = ensure_pair()
    target, drafter = load_models(pair / "target", pair / "drafter", "float32")
    taps = tuple(drafter.config.target_layer_ids)

    def verify(ids, step, cache):
        return target(ids, step, cache, taps)

    traced = torch.compile(verify, backend="eager", dynamic=True)
    engine = build_engine(target, drafter, max_batch=8, max_context=256, max_tree_nodes=64)
    prompts = [p[:64] for p in json.loads((pair / "heldout_prompts.json").read_text())]
    with torch.inference_mode():
        batch = engine.open_batch(Spec.none(), args.batch)
        batch.round.forward = lambda ids, step, cache, _taps: traced(ids, step, cache)
        batch.admit(prompts[:args.batch], [SamplingParams(max_tokens=args.tokens)] * args.batch)
        while batch.live_rows():
            batch.step()
    frames = counters["frames"]
    print(f"batch {args.batch}: {batch.stats.rounds} rounds, {frames['ok']} graphs compiled of "
          f"{frames['total']} frame compiles asked (the rest hit the recompile limit and ran "
          f"eager)")


if __name__ == "__main__":
    main()
