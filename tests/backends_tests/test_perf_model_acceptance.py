"""Expected acceptance of a DFlash chain and a DDTree tree."""

from __future__ import annotations

import pytest

from backends.perf_model.acceptance import DrafterProfile
from backends.perf_model.acceptance import chain_acceptance
from backends.perf_model.acceptance import tree_acceptance

REF = DrafterProfile((0.75,))  # the reference drafter: 0.75 a position
FALLING = DrafterProfile((0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3), rank_decay=0.5)


def _hist_mean(hist: tuple[float, ...]) -> float:
    return sum(n * p for n, p in enumerate(hist, start=1))


@pytest.mark.parametrize("a", [0.0, 0.3, 0.75, 1.0])
@pytest.mark.parametrize("block", [2, 4, 8, 16])
def test_chain_of_constant_profile_is_a_geometric_sum(a, block):
    # bonus token + P(first k drafts all right) for k = 1 .. block - 1
    expected = 1 + sum(a**k for k in range(1, block))
    assert chain_acceptance(DrafterProfile((a,)), block).mean == pytest.approx(expected)


def test_reference_drafter_accepts_3_6_tokens_a_block_8_step():
    # 1 + 0.75 (1 - 0.75^7) / 0.25 = 1 + 3 x 0.86652 = 3.5996, inside the node's 3.5-4.1
    assert chain_acceptance(REF, 8).mean == pytest.approx(3.5996, abs=1e-4)


def test_chain_uses_each_depths_own_probability():
    # 1 + 0.9 + 0.9 x 0.8 + 0.9 x 0.8 x 0.7 = 1 + 0.9 + 0.72 + 0.504 = 3.124
    assert chain_acceptance(FALLING, 4).mean == pytest.approx(3.124)


@pytest.mark.parametrize("acc", [chain_acceptance(REF, 8), chain_acceptance(FALLING, 6),
                                 tree_acceptance(FALLING, 24, 3, 5),
                                 tree_acceptance(REF, 64, 4, 7)])
def test_hist_is_a_distribution_whose_mean_is_the_mean(acc):
    assert all(p >= -1e-12 for p in acc.hist)
    assert sum(acc.hist) == pytest.approx(1.0)
    assert _hist_mean(acc.hist) == pytest.approx(acc.mean)


def test_chain_hist_by_hand():
    # block 3, a = 0.5: exactly 1 token w.p. 0.5, 2 w.p. 0.25, 3 w.p. 0.25
    assert chain_acceptance(DrafterProfile((0.5,)), 3).hist == pytest.approx((0.5, 0.25, 0.25))


def test_tiny_tree_by_hand():
    # depth 1, two children of the root: rank 1 p = 0.5, rank 2 p = (1 - 0.5)(1 - 0.5) = 0.25
    # mean = 1 + 0.5 + 0.25 = 1.75; one token w.p. 0.25, two w.p. 0.75
    acc = tree_acceptance(DrafterProfile((0.5,), rank_decay=0.5), budget=2, topk=2,
                          max_depth=1)
    assert acc.mean == pytest.approx(1.75)
    assert acc.hist == pytest.approx((0.25, 0.75))


def test_best_first_tree_by_hand():
    # budget 3, depth 2, topk 2: take d1r1 (0.5), then the tie d1r2 (0.25) and d2r1
    # (0.5 x 0.5 = 0.25); d2 under d1r2 (0.125) is left out. mean = 1 + 0.5 + 0.25 + 0.25 = 2.0
    acc = tree_acceptance(DrafterProfile((0.5,), rank_decay=0.5), budget=3, topk=2,
                          max_depth=2)
    assert acc.mean == pytest.approx(2.0)
    assert acc.hist == pytest.approx((0.25, 0.5, 0.25))


@pytest.mark.parametrize("profile", [REF, FALLING])
@pytest.mark.parametrize("depth", [1, 3, 7])
def test_tree_with_topk_1_is_the_chain(profile, depth):
    assert tree_acceptance(profile, budget=depth, topk=1, max_depth=depth) == \
        chain_acceptance(profile, depth + 1)


@pytest.mark.parametrize("profile", [REF, FALLING])
@pytest.mark.parametrize("topk", [2, 4, 8])
def test_tree_accepts_at_least_the_chain_at_equal_depth(profile, topk):
    chain = chain_acceptance(profile, 8).mean
    for budget in (7, 8, 16, 64):
        assert tree_acceptance(profile, budget, topk, max_depth=7).mean >= chain - 1e-12


@pytest.mark.parametrize("profile", [REF, FALLING])
@pytest.mark.parametrize("topk", [1, 2, 4])
def test_tree_acceptance_never_falls_as_the_budget_grows(profile, topk):
    means = [tree_acceptance(profile, b, topk, max_depth=7).mean for b in range(1, 130)]
    assert all(later >= earlier - 1e-12 for earlier, later in zip(means, means[1:]))
    assert means[-1] <= 1 + 7  # never more than the bonus plus every depth


def test_wider_trees_help_a_weak_drafter_more_than_a_chain_can():
    weak = DrafterProfile((0.4,), rank_decay=0.6)
    assert tree_acceptance(weak, 32, 4, 7).mean > chain_acceptance(weak, 8).mean + 0.3


@pytest.mark.parametrize("bad", [dict(top1=()), dict(top1=(1.2,)),
                                 dict(top1=(0.5,), rank_decay=1.0)])
def test_profile_rejects_non_probabilities(bad):
    with pytest.raises(ValueError):
        DrafterProfile(**bad)


def test_fit_acceptance_scales_the_drafters_profile_to_measured_accept_lengths():
    """Tokens per round measured by the engine (here: made by a drafter accepting 0.6 a
    position) pull the configured profile (0.75) to the one that produced them."""
    from dataclasses import replace

    from backends.contract import Workload
    from backends.deployment import Deployment, DrafterSpec
    from backends.flags import LaunchTarget
    from backends.launch_params import LaunchParams
    from backends.perf_model import Efficiency, PerfModelBackend
    from backends.perf_model.acceptance_fit import fit_acceptance

    drafter = DrafterSpec(block_size=8, num_layers=1, target_layers=(1, 3, 4), num_heads=6,
                          num_kv_heads=2, head_dim=32, intermediate_size=576, acceptance=(0.75,))
    dep = Deployment(gpu="cpu-2core-vm", gpus=1, model="fixtures/tiny_code/target/config.json",
                     target=LaunchTarget(model_path="t", drafter_path="d"), drafter=drafter,
                     engine="vllm")
    truth = replace(dep, drafter=replace(drafter, acceptance=(0.6,)))
    work, eff = Workload(64, 64, (1,)), Efficiency()
    launches = [LaunchParams(tp_size=1, cuda_graph=False, speculative_algorithm="dflash",
                             speculative_dflash_block_size=b) for b in (4, 8)]
    measured = [(lp, PerfModelBackend(truth, eff).measure(lp, work)[0].accept_len_mean)
                for lp in launches]
    measured.append((LaunchParams(tp_size=1, cuda_graph=False), None))  # plain: ignored
    fitted = fit_acceptance(dep, eff, work, measured)
    assert fitted.drafter.acceptance == pytest.approx((0.6,))
    assert fit_acceptance(dep, eff, work, measured[-1:]) is dep  # nothing speculative measured
