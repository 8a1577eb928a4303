"""Kimi-K3's hybrid architecture in the performance model: KDA linear-attention layers (a fixed
state a request, no KV cache) beside MLA ones, and LatentMoE (experts in a narrower latent),
priced from the real measured tables of the B300 (its KDA kernels and the K3 MoE shape).

Expected numbers are worked out by hand from Kimi-K3's config (models.yaml), with the
arithmetic in the comments."""

from __future__ import annotations

import json
from dataclasses import replace
from importlib import resources

import pytest

from backends.launch_params import LaunchParams
from backends.perf_model.calibrate import compare
from backends.perf_model.catalog import load_hardware, load_model, model_from_config
from backends.perf_model.kernels.tables import tables_for
from backends.perf_model.memory import kv_capacity_tokens, plan_memory
from backends.perf_model.node import Node
from backends.perf_model.references import VALIDATION_DIR, load_reference, model_predictor
from backends.perf_model.shipped import default_efficiency
from backends.perf_model.step import target_forward
from backends.perf_model.terms import MEASURED, ROOFLINE, linear_attention

GIB = 2**30
# 93 layers: 69 KDA, 24 MLA. An MLA layer caches its 512 + 64 latent in bf16: 1,152 B a token;
# 24 of them: 27,648 B (all 93 would be 107,136).
K3_KV_BYTES_PER_TOKEN = 24 * 576 * 2
# A KDA layer's state: 96 heads x 128 x 128 fp32 = 6,291,456 B, and the short convolution's
# last 3 inputs of q, k and v (3 x 3 x 12,288 bf16) = 221,184 B: 6,512,640 B; 69 layers:
# 449,372,160 B a request, 56,171,520 B on each of 8 ranks.
K3_STATE_BYTES_TP8 = 69 * (96 * 128 * 128 * 4 + 3 * 3 * 96 * 128 * 2) / 8
# A routed expert in the 3,584-wide latent: 3 x 3,584 x 3,072 = 33,030,144 params.
K3_EXPERT = 3 * 3584 * 3072


@pytest.fixture(scope="module")
def k3():
    return load_model("kimi-k3")


def _b300(engine: str = "sglang") -> Node:
    hw = load_hardware("b300-sxm")
    return Node(hw, default_efficiency(hw.name, engine, True),
                tables_for(hw.measured_system, engine), engine)


def test_k3_has_24_attention_layers_69_kda_layers_and_latent_experts(k3):
    assert k3.num_attention_layers == 24
    assert (k3.linear_attention.layers, k3.linear_attention.heads,
            k3.linear_attention.head_dim) == (69, 96, 128)
    assert (k3.moe_hidden, k3.moe_inter, k3.expert_params) == (3584, 3072, K3_EXPERT)
    assert k3.shared_expert_params == 2 * 3 * 7168 * 3072  # two 3,072-wide, in the hidden
    assert k3.expert_weight_bits == 4.25 and k3.expert_format == "mxfp4"
    names = {x.name: x for x in k3.linears}
    assert names["latent_down"].per_forward == names["latent_up"].per_forward == 92
    assert names["kda_qkvg"].per_forward == 69 and names["o_gate"].per_forward == 24
    # 92 x 896 x 33,030,144 = 2.7227 T routed; with ~54 B dense params: the model's "2.8T".
    routed = k3.num_moe_layers * k3.num_experts * k3.expert_params
    assert routed == 2_722_740_830_208
    assert (routed + k3.dense_params) / 1e12 == pytest.approx(2.78, abs=0.01)


def test_the_config_aiconfigurator_bundles_reads_as_the_catalog_entry(k3):
    """The published config.json (its own key names, its MXFP4 quantisation block with 8-bit
    scales) gives the same architecture as the catalog's entry."""
    path = resources.files("aiconfigurator_core") / "model_configs"
    config = json.loads((path / "moonshotai--Kimi-K3_config.json").read_text())
    assert replace(model_from_config("kimi-k3", config), name="kimi-k3") == k3


def test_only_the_mla_layers_keep_kv_and_each_request_keeps_its_kda_state(k3):
    lp = LaunchParams(tp_size=8)
    assert kv_capacity_tokens(k3, None, lp, 1.0) == pytest.approx(GIB / K3_KV_BYTES_PER_TOKEN)
    # Requests of one token each, no running cap: the state, not the KV, bounds them.
    plan = plan_memory(k3, None, replace(lp, max_running_requests=10**6), 268.2, 1)
    per_request = K3_KV_BYTES_PER_TOKEN + K3_STATE_BYTES_TP8
    assert plan.max_requests == int(plan.kv_pool_gib * GIB // per_request)


@pytest.mark.parametrize("engine", ["sglang", "vllm"])
def test_kda_layers_are_timed_by_the_b300_kda_kernels(k3, engine):
    node = _b300(engine)
    one = linear_attention(node, k3, 16, 1, 12, "generation")
    verify = linear_attention(node, k3, 16, 8, 12, "verify")
    prompt = linear_attention(node, k3, 1, 8192, 12, "context")
    assert {one.source, verify.source, prompt.source} == {MEASURED}
    # An 8-token verify runs the recurrence 8 steps on one state read: more than a decode
    # step, less than eight.
    assert one.ms < verify.ms < 8 * one.ms
    assert prompt.ms > verify.ms
    # 12 heads a rank (96 / TP8) were timed; 5 heads (not a divisor) were not: the roofline.
    assert linear_attention(node, k3, 16, 1, 5, "generation").source == ROOFLINE


def test_kda_layers_add_no_cost_that_grows_with_context(k3):
    """A decode step's attention grows with context only through the 24 MLA layers: 24/93 of
    what it would if every layer were MLA."""
    node, lp = _b300(), LaunchParams(tp_size=8)
    all_mla = replace(k3, linear_attention=None)

    def growth(m):
        at = [target_forward(node, m, lp, 16, 1, ctx, True, 16).attention.ms
              for ctx in (1024, 16384)]
        return at[1] - at[0]

    assert growth(k3) == pytest.approx(growth(all_mla) * 24 / 93, rel=1e-6)


@pytest.mark.parametrize("engine", ["sglang", "vllm"])
def test_k3_experts_are_timed_by_the_measured_mxfp4_moe_kernel(k3, engine):
    node, lp = _b300(engine), LaunchParams(tp_size=8)
    times = [target_forward(node, k3, lp, n, 1, 1024, True, n).moe for n in (1, 8, 64)]
    assert all(t.source == MEASURED for t in times)
    assert times[0].ms < times[1].ms < times[2].ms


def test_the_k3_cookbook_speedup_falls_with_load_on_measured_kernels():
    """SGLang's Kimi-K3 DSpark cookbook measured 2.76x -> 1.68x -> 1.42x at 1 / 16 / 64
    requests. With KDA and LatentMoE read as MLA and wide experts the model made it rise
    (1.51x -> 1.94x); on the B300's measured K3 kernels it falls."""
    src = load_reference(str(VALIDATION_DIR / "sglang_cookbook_kimi_k3_dspark_b300.yaml"))
    dep = replace(src.deployment, measured_kernels=True)
    observations = [o for o in src.observations if o.metric == "speedup"]
    rows = compare(model_predictor(dep), default_efficiency(dep.gpu, dep.engine, True),
                   sorted(observations, key=lambda o: o.at), src.workload)
    predicted = [row.predicted for row in rows]
    assert predicted[0] > predicted[1] > predicted[2] > 1.0


@pytest.mark.parametrize("change", [{"num_heads": 0}, {"head_dim": "128"},
                                    {"kda_layers": list(range(93))}])
def test_a_damaged_linear_attention_config_is_refused_by_name(change):
    from backends.perf_model.catalog import CatalogError, _catalog

    config = dict(_catalog("models.yaml")["models"]["kimi-k3"])
    config["linear_attn_config"] = {**config["linear_attn_config"], **change}
    with pytest.raises(CatalogError, match="linear_attn_config"):
        model_from_config("broken", config)


def test_the_breakdown_shows_linear_attention_as_its_own_measured_term_for_a_hybrid_only():
    from backends.perf_model.backend import PerfModelBackend
    from backends.perf_model.predict import predict

    def breakdown(source: str):
        src = load_reference(source)
        backend = PerfModelBackend(replace(src.deployment, measured_kernels=True))
        m = predict(backend.setup(LaunchParams(tp_size=8), src.workload), src.workload, 16)
        return m.breakdown_ms, m.breakdown_source

    ms, source = breakdown(str(VALIDATION_DIR / "sglang_cookbook_kimi_k3_dspark_b300.yaml"))
    assert ms["linear_attention"] > 0 and source["linear_attention"] == MEASURED
    ms, _ = breakdown("pcie8_kimi_sglang")
    assert "linear_attention" not in ms and ms["attention"] > 0
