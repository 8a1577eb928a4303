"""The validation data: every published source in its own YAML, cited, its setup stated, and
loadable; the facts a source states that need no fit (a logged KV capacity) hold."""

from __future__ import annotations

import pytest
import yaml

from backends.perf_model.acceptance import chain_acceptance, profile_for_length
from backends.perf_model.backend import PerfModelBackend
from backends.perf_model.calibrate import TTFT, compare
from backends.perf_model.references import model_predictor
from backends.perf_model.shipped import default_efficiency
from backends.perf_model.references import (
    VALIDATION_DIR,
    fitted_sources,
    load_reference,
    validation_sources,
)

FILES = sorted(VALIDATION_DIR.glob("*.yaml"))


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_validation_source_cites_its_origin_and_states_its_setup(path):
    raw = yaml.safe_load(path.read_text())
    assert raw["source"]["cite"].strip() and raw["source"]["setup"].strip()
    ref = load_reference(str(path))
    assert any(o.fitted for o in ref.observations), "a source needs a throughput or speedup"


def test_validation_covers_the_named_sources_and_three_more():
    groups = {s.source_group for s in validation_sources()}
    named = {"pcie8_kimi_sglang", "dflash_paper_table5_llama8b_b200",
             "vllm_recipe_kimi_k2_thinking_h200"}
    assert named <= groups and len(groups - named) >= 3


def test_compared_only_sources_state_why_and_stay_out_of_every_fit():
    sources = validation_sources()
    compared_only = [s for s in sources if s.not_fitted]
    assert compared_only, "the Kimi-K2.5 cookbook's loaded cells are compared, never fitted"
    assert all(len(s.not_fitted.split()) >= 5 for s in compared_only), "a reason, not a flag"
    fitted = fitted_sources(sources)
    assert not {s.name for s in fitted} & {s.name for s in compared_only}
    assert len(fitted) + len(compared_only) == len(sources)


def test_kimi_k25s_loaded_cells_are_compared_and_left_out_with_its_fitted_cell():
    sources = {s.name: s for s in validation_sources()}
    one = sources["sglang_cookbook_kimi_k25_h200"]
    loaded = sources["sglang_cookbook_kimi_k25_h200_loaded"]
    assert not one.not_fitted and loaded.not_fitted
    assert one.source_group == loaded.source_group


def test_one_request_ttfts_are_fitted_and_a_saturated_runs_queue_is_compared():
    """A median TTFT where every request has a slot times a prefill: fitted (it identifies the
    prefill's cost). A saturated run's TTFT is its queue: the observation says so and stays out
    of the fit. A TPOT is the decode side of a fitted throughput: never fitted."""
    deepseek = load_reference(str(VALIDATION_DIR / "sglang_cookbook_deepseek_r1_b200.yaml"))
    ttfts = [o for o in deepseek.observations if o.metric == TTFT]
    assert ttfts and all(o.fitted for o in ttfts)
    assert not any(o.fitted for o in deepseek.observations if o.metric == "tpot_p50_ms")
    kimi = load_reference(str(VALIDATION_DIR / "vllm_recipe_kimi_k2_thinking_h200.yaml"))
    [queue] = [o for o in kimi.observations if o.metric == TTFT]
    assert not queue.fitted and "queue" in queue.compared
    rows = compare(model_predictor(kimi.deployment), default_efficiency("h200-sxm", "vllm"),
                   [queue], kimi.workload)
    assert not rows[0].fitted


def test_kimi_recipe_kv_capacity_is_what_vllm_logged():
    ref = load_reference(str(VALIDATION_DIR / "vllm_recipe_kimi_k2_thinking_h200.yaml"))
    backend = PerfModelBackend(ref.deployment)
    (check,) = ref.kv_checks
    tokens = backend.kv_capacity(check.launch, check.kv_pool_gib)
    assert tokens == pytest.approx(check.tokens, rel=0.005)


def test_the_fp8_kv_budgets_the_community_logged_are_what_the_model_plans():
    """The rtx6kpro page's start-up KV budgets for Kimi-K2.6 on 8x RTX PRO 6000 (vLLM, FP8
    cache, decode context parallelism 1-8, with and without the drafter, each at its memory
    fraction): the model's pools hold within 11% of them. A bf16 cache holds half as many."""
    from dataclasses import replace

    ref = load_reference(str(VALIDATION_DIR / "rtx6kpro_kimi_k26_vllm_eagle3_pcie8.yaml"))
    backend = PerfModelBackend(ref.deployment)
    assert len(ref.kv_checks) == 8
    for check in ref.kv_checks:
        assert check.kv_pool_gib is None and check.launch.kv_cache_dtype == "fp8_e4m3"
        tokens = backend.kv_capacity(check.launch)
        assert tokens == pytest.approx(check.tokens, rel=0.11), check.name
        bf16 = replace(check.launch, kv_cache_dtype="auto")
        assert backend.kv_capacity(bf16) == pytest.approx(tokens / 2)


@pytest.mark.parametrize("length, block", [(6.1, 10), (3.6, 8), (1.5, 16)])
def test_acceptance_length_is_inverted_to_a_profile_with_that_mean(length, block):
    profile = profile_for_length(length, block)
    assert chain_acceptance(profile, block).mean == pytest.approx(length, abs=1e-3)


def test_acceptance_length_beyond_the_block_is_refused():
    with pytest.raises(ValueError, match="must lie in"):
        profile_for_length(9.0, 8)


@pytest.mark.parametrize("source", validation_sources(), ids=lambda s: s.name)
def test_every_published_point_is_priced_by_the_model(source):
    """A point the model refuses (a launch its engine rules forbid) would be predicted as
    nothing and score as the worst miss: each source's launches are ones the model prices."""
    dep = source.deployment
    efficiency = default_efficiency(dep.gpu, dep.engine)
    for row in compare(model_predictor(dep), efficiency, source.observations, source.workload):
        assert row.predicted > 0, row.name


@pytest.mark.parametrize("measured", [False, True], ids=["roofline", "measured"])
def test_red_hats_counterexample_stays_a_gain_at_200_requests(measured):
    """gpt-oss-120B with an EAGLE-3 drafter on vLLM still gained 10-21% at 200 requests: the
    shipped constants must not predict a crossover there. The speculation round's own cost is
    the engine's: SGLang's DFlash rounds (171 us a request with measured kernels) applied to
    vLLM's predicted 0.76x."""
    from dataclasses import replace

    src = load_reference(str(VALIDATION_DIR / "redhat_gpt_oss_120b_eagle3_h200.yaml"))
    dep = replace(src.deployment, measured_kernels=measured)
    (row,) = compare(model_predictor(dep), default_efficiency(dep.gpu, dep.engine, measured),
                     src.observations, src.workload)
    assert row.predicted > 1.0


def test_eagle3_on_the_users_node_loses_its_gain_with_load_on_measured_kernels():
    """The community's Kimi-K2.6 EAGLE-3 decode matrix on 8x RTX PRO 6000 (vLLM): 1.32x at one
    stream, 1.01x at 128. Priced on the node's measured kernels with the shipped constants,
    the chain drafter's speedup falls by at least two thirds of that."""
    from dataclasses import replace

    src = load_reference(str(VALIDATION_DIR / "rtx6kpro_kimi_k26_vllm_eagle3_pcie8.yaml"))
    dep = replace(src.deployment, measured_kernels=True)
    assert dep.drafter.chain
    speedups = {o.at: o for o in src.observations if o.metric == "speedup"}
    rows = compare(model_predictor(dep), default_efficiency(dep.gpu, dep.engine, True),
                   [speedups[1], speedups[128]], src.workload)
    one, loaded = (r.predicted for r in rows)
    assert one > 1.0 and one - loaded >= 2 / 3 * (1.32 - 1.01)
