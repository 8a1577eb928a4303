"""Which routed experts one MoE layer touches in a step, and how unevenly EP ranks are loaded.

Routing is one number per model, ``ModelArch.routing_skew``: the Zipf exponent ``s`` of expert
popularity (the r-th most popular expert is picked with weight ``r ** -s``). ``s = 0`` is uniform
routing, where every function here reduces exactly to the uniform formula. Skew has two effects
of opposite sign: fewer distinct experts are touched (less expert weight streamed), and the EP
rank holding the hot experts receives more of the tokens (more GEMM work and all-to-all bytes
on the rank the step waits for). No catalog model ships a skew (all 0): a measured routing
histogram should set it.
"""

from __future__ import annotations

import math
from functools import lru_cache

from backends.errors import UserError


def expected_distinct_experts(num_experts: int, top_k: int, tokens: int,
                              skew: float = 0.0) -> float:
    """Experts touched in one MoE layer when ``tokens`` tokens each pick ``top_k``."""
    if skew == 0:
        return num_experts * (1.0 - (1.0 - top_k / num_experts) ** tokens)
    return sum(_touched(p, tokens) for p in pick_probabilities(num_experts, top_k, skew))


def busiest_rank_experts(num_experts: int, top_k: int, tokens: int, ep: int,
                         skew: float = 0.0) -> float:
    """Experts the most loaded EP rank holds among those touched: the step waits for it. Its
    expected count (the rank holding the hottest experts, see ``rank_pick_probabilities``) plus
    a balls-in-bins fluctuation; a rank cannot hold more than its share."""
    if ep <= 1:
        return expected_distinct_experts(num_experts, top_k, tokens, skew)
    if skew == 0:
        mean = expected_distinct_experts(num_experts, top_k, tokens) / ep
    else:
        mean = sum(_touched(p, tokens)
                   for p in rank_pick_probabilities(num_experts, top_k, ep, skew)[0])
    return min(num_experts / ep, mean + math.sqrt(2.0 * mean * math.log(ep)))


def ep_load_imbalance(num_experts: int, top_k: int, ep: int, skew: float = 0.0) -> float:
    """The busiest EP rank's expected share of the token-to-expert assignments over the mean
    rank's (1 under uniform routing): its GEMM rows and the all-to-all bytes it receives."""
    if ep <= 1 or skew == 0:
        return 1.0
    busiest = sum(rank_pick_probabilities(num_experts, top_k, ep, skew)[0])
    return busiest / (top_k / ep)


def rank_pick_probabilities(num_experts: int, top_k: int, ep: int,
                            skew: float) -> list[tuple[float, ...]]:
    """Each rank's experts' pick probabilities, experts dealt round-robin in popularity order
    (rank 0 gets the hottest, then the (ep+1)-th, ...): the placement a static balancer reaches
    without replicating experts, so the imbalance it gives is the least skew forces."""
    probs = pick_probabilities(num_experts, top_k, skew)
    return [probs[r::ep] for r in range(ep)]


@lru_cache(maxsize=256)
def pick_probabilities(num_experts: int, top_k: int, skew: float) -> tuple[float, ...]:
    """P(one token picks expert i), hottest first: ``top_k`` times the Zipf weights, each capped
    at 1 (a token picks an expert at most once) with the excess spread over the rest in
    proportion to their weights. Sums to ``top_k``."""
    if skew < 0:
        raise UserError(f"routing skew must be >= 0, got {skew}")
    weights = [(rank + 1) ** -skew for rank in range(num_experts)]
    probs = [0.0] * num_experts
    free, budget = list(range(num_experts)), float(top_k)
    while free:
        total = sum(weights[i] for i in free)
        capped = [i for i in free if budget * weights[i] / total >= 1.0]
        if not capped:
            for i in free:
                probs[i] = budget * weights[i] / total
            break
        for i in capped:
            probs[i] = 1.0
        budget -= len(capped)
        done = set(capped)
        free = [i for i in free if i not in done]
    return tuple(probs)


def _touched(p: float, tokens: int) -> float:
    """P(an expert picked with probability ``p`` by each token is picked by any of ``tokens``)."""
    return 1.0 - (1.0 - p) ** tokens
