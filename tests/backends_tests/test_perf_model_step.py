"""One decode step by component: experts touched, host launches, KV reads, collectives.

Constants are the defaults (bandwidth efficiency 0.6, 30 us a collective, 25 us a launch) on an
RTX PRO 6000 Server (1597 GB/s, 500 TFLOP/s BF16, PCIe 64 GB/s), so the arithmetic is by hand.
"""

from __future__ import annotations

import dataclasses

import pytest

from backends.contract import Workload
from backends.launch_params import LaunchParams
from backends.perf_model import PerfModelBackend
from backends.perf_model.catalog import load_hardware, load_model
from backends.perf_model.constants import Efficiency
from backends.perf_model.predict import predict, step_breakdown
from backends.perf_model.routing import busiest_rank_experts, expected_distinct_experts
from backends.perf_model.step import Node, draft_forward, graphed, target_forward

TP8 = LaunchParams(tp_size=8)
TP8_EAGER = LaunchParams(tp_size=8, cuda_graph=False)
EP8 = LaunchParams(tp_size=8, ep_size=8)
CONTEXT = 1536.0  # 1024 in + 512 out

# --- experts touched -------------------------------------------------------------------------


def test_one_token_touches_exactly_top_k_experts():
    assert expected_distinct_experts(384, 8, 1) == pytest.approx(8)


@pytest.mark.parametrize("tokens, expected", [(16, 82), (64, 126)])
def test_128_experts_top_8_touch_82_at_16_tokens_and_126_at_64(tokens, expected):
    # REFERENCE_NUMBERS roofline rules: 128 x (1 - (120/128)^16) = 128 x 0.6439 = 82.4;
    # 128 x (1 - (120/128)^64) = 128 x 0.9839 = 125.9
    assert expected_distinct_experts(128, 8, tokens) == pytest.approx(expected, abs=0.5)


def test_distinct_experts_grow_with_tokens_and_saturate():
    touched = [expected_distinct_experts(384, 8, t) for t in (1, 2, 8, 64, 512, 4096)]
    assert touched == sorted(touched)
    assert touched[-1] == pytest.approx(384, rel=1e-6)


@pytest.mark.parametrize("ep", [2, 4, 8])
@pytest.mark.parametrize("tokens", [1, 4, 16, 64, 256, 2048])
def test_busiest_rank_holds_at_least_the_mean_and_at_most_its_share(ep, tokens):
    touched = expected_distinct_experts(384, 8, tokens)
    busiest = busiest_rank_experts(384, 8, tokens, ep)
    assert touched / ep - 1e-9 <= busiest <= 384 / ep + 1e-9


@pytest.mark.parametrize("tokens", [1, 16, 256])
def test_busiest_rank_without_ep_is_every_touched_expert(tokens):
    assert busiest_rank_experts(384, 8, tokens, 1) == expected_distinct_experts(384, 8, tokens)


def test_busiest_rank_at_one_token_by_hand():
    # 8 touched over 8 ranks: mean 1, + sqrt(2 x 1 x ln 8) = 2.0393 -> 3.0393
    assert busiest_rank_experts(384, 8, 1, 8) == pytest.approx(3.0393, abs=1e-4)


# --- host launches ---------------------------------------------------------------------------


def test_graph_replay_costs_16_launches_and_eager_costs_every_kernel(pcie_node, kimi):
    graphs = target_forward(pcie_node, kimi, TP8, 1, 1, CONTEXT, use_graph=True)
    eager = target_forward(pcie_node, kimi, TP8, 1, 1, CONTEXT, use_graph=False)
    assert graphs.host == pytest.approx(16 * 0.025)  # 0.4 ms
    # 1,276 kernels (eager_launches_by_hand) + 123 all-reduces and the logit gather + 20 a
    # forward = 1,420 launches x 25 us = 35.5 ms
    assert eager.host == pytest.approx(35.5)
    assert graphs.device == eager.device  # graphs change launches, not GPU work


def test_eager_launches_by_hand(kimi):
    # Kimi K2.6: GEMMs q/kv down, q up and o in 61 MLA layers (kv_b runs as the two batched
    # GEMMs among the small kernels), one dense MLP (2), 60 shared experts (2), the LM head:
    # 306; the routed experts' two grouped GEMMs in 60 MoE layers: 120; small kernels
    # 61 x 8 + 2 + 60 x 6 = 850
    assert kimi.eager_launches == 306 + 120 + 850
    # Qwen3-8B: 36 layers of qkv, o, gate_up, down and the LM head; 36 x 7 small kernels
    qwen = load_model("qwen3-8b")
    assert qwen.eager_launches == 36 * 4 + 1 + 36 * 7
    # an MoE layer launches about twice a dense one's kernels
    assert kimi.eager_launches / kimi.num_layers > 1.8 * qwen.eager_launches / qwen.num_layers


@pytest.fixture
def model_backend(pcie8_reference):
    return PerfModelBackend(pcie8_reference.deployment, Efficiency())


def _setup(backend, **params):
    return backend.setup(LaunchParams(**{"max_running_requests": 256, "cuda_graph_max_bs": 256,
                                         **params}),
                         Workload(1024, 512, (1,)))


def test_eager_step_at_concurrency_1_is_all_host_time(model_backend):
    parts = step_breakdown(_setup(model_backend, cuda_graph=False), 1, CONTEXT)
    # the host issues 35.5 ms of launches while the GPU needs ~8.8 ms: the step is host-bound
    assert sum(parts.values()) == pytest.approx(35.5)


def test_graphed_step_at_concurrency_1_hides_most_host_time(model_backend):
    parts = step_breakdown(_setup(model_backend), 1, CONTEXT)
    assert parts["host_exposed"] == pytest.approx(0.3 * 0.4)  # the floor: 30% of 16 launches
    eager = sum(step_breakdown(_setup(model_backend, cuda_graph=False), 1, CONTEXT).values())
    assert 2.0 < eager / sum(parts.values()) < 4.0


def _round_terms(reference, version, launch_us=25.0, **params):
    """One DFlash round at one request under SGLang ``version``, 2 ms of round work."""
    deployment = dataclasses.replace(reference.deployment, engine_version=version)
    eff = Efficiency(spec_round_us=2000.0, launch_overhead_us=launch_us)
    backend = PerfModelBackend(deployment, eff)
    params = {"tp_size": 8, "speculative_algorithm": "dflash", **params}
    return step_breakdown(_setup(backend, **params), 1, CONTEXT)


def test_a_serial_round_adds_its_work_and_an_overlapped_one_hides_it_behind_the_gpu(
        pcie8_reference):
    serial = _round_terms(pcie8_reference, "0.5.13")  # spec-v1 worker: overlap forced off
    overlapped = _round_terms(pcie8_reference, "0.5.14")  # spec-v2 worker
    assert serial["spec_round"] == pytest.approx(2.0)
    # graphed, the GPU outlasts the host's launches and work: only the floor (30%) shows
    assert overlapped["spec_round"] == pytest.approx(0.3 * 2.0)
    assert serial["spec_round"] - overlapped["spec_round"] == pytest.approx(
        sum(serial.values()) - sum(overlapped.values()))


def test_a_host_bound_round_pays_its_work_whole_overlapped_or_not(pcie8_reference):
    serial = _round_terms(pcie8_reference, "0.5.13", 50.0, cuda_graph=False)
    overlapped = _round_terms(pcie8_reference, "0.5.14", 50.0, cuda_graph=False)
    assert overlapped == pytest.approx(serial)
    # eager at 50 us a launch: 76 ms of launches (target 71, drafter 5) outlast the GPU's
    # ~27 ms, and the host's round work comes on top of them
    assert sum(serial.values()) == pytest.approx(71.0 + 5.0 + 2.0)


def test_ddtree_rounds_stay_serial_where_dflash_rounds_overlap(pcie8_reference):
    tree = _round_terms(pcie8_reference, "0.5.23", speculative_algorithm="ddtree")
    assert tree["spec_round"] == pytest.approx(2.0)  # the DDTree branch forces the overlap off


def test_batch_pads_up_to_the_next_captured_size_and_runs_eagerly_past_the_largest():
    lp = LaunchParams(tp_size=8, cuda_graph_max_bs=32, max_running_requests=64)
    assert lp.capture_batch_sizes == (1, 2, 4, 8, 16, 24, 32)
    assert [graphed(lp, b) for b in (1, 3, 5, 17, 32, 33)] == [1, 4, 8, 24, 32, None]
    assert graphed(TP8_EAGER, 1) is None


# --- KV reads --------------------------------------------------------------------------------


def test_kv_read_of_one_request_by_hand(pcie_node, kimi):
    # MLA latent is replicated on every TP rank, so each GPU reads all of it:
    # 1536 tokens x 70,272 B = 107,937,792 B / (1597e9 x 0.6 B/s) = 0.112646 ms
    kv = target_forward(pcie_node, kimi, TP8, 1, 1, CONTEXT, use_graph=True).attention.ms
    assert kv == pytest.approx(0.112646, rel=1e-5)


@pytest.mark.parametrize("lp", [TP8, EP8])
def test_verify_reads_the_prefix_kv_once_whatever_the_tokens_per_request(pcie_node, kimi, lp):
    kv = [target_forward(pcie_node, kimi, lp, 4, n, CONTEXT, use_graph=True).attention.ms
          for n in (1, 8, 17)]
    assert kv[0] == pytest.approx(4 * 0.112646, rel=1e-5)  # 4 requests, memory-bound
    assert kv[1] == kv[0] and kv[2] == kv[0]


def test_kv_turns_compute_bound_for_large_verify_windows(pcie_node, kimi):
    # 4 x 64 tokens x 1536 ctx x 61 layers x 139,264 FLOPs / 8 GPUs = 4.18e11 FLOPs
    # / (500e12 x 0.7) = 1.193 ms > 0.4506 ms of KV reads
    kv = target_forward(pcie_node, kimi, TP8, 4, 64, CONTEXT, use_graph=True).attention.ms
    assert kv == pytest.approx(1.1930, abs=1e-3)


def test_gqa_kv_splits_by_head_up_to_the_kv_head_count(pcie_node):
    qwen = load_model("qwen3-8b")
    kv = {tp: target_forward(pcie_node, qwen, LaunchParams(tp_size=tp), 1, 1, CONTEXT, True).attention.ms
          for tp in (1, 2, 8)}
    # 1536 x 36 layers x 4096 B = 226,492,416 B / 958.2e9 B/s = 0.236373 ms on one GPU
    assert kv[1] == pytest.approx(0.236373, rel=1e-5)
    assert kv[2] == pytest.approx(kv[1] / 2) and kv[8] == pytest.approx(kv[1] / 8)


# --- collectives -----------------------------------------------------------------------------


def test_ring_collective_by_hand(pcie_node):
    # all-reduce of 14,336 B over 8: 30 us + 2 x 7/8 x 14,336 B / 64 GB/s = 0.030 + 0.000392 ms
    assert pcie_node.collective_ms(14_336, 8, all_reduce=True) == pytest.approx(0.030392)
    assert pcie_node.collective_ms(14_336, 8, all_reduce=False) == pytest.approx(0.030196)
    assert pcie_node.collective_ms(14_336, 1, all_reduce=True) == 0.0


def test_tp8_decode_does_two_all_reduces_a_layer_and_one_logit_gather(pcie_node, kimi):
    # one token: hidden 7168 x 2 B = 14,336 B; 61 layers x 2 all-reduces + 1 for the
    # vocabulary-parallel embedding = 123, plus the LM head's all-gather of 163,840 x 2 B:
    # 123 x 0.030392 + (0.030 + 7/8 x 327,680 / 64e9 x 1e3 = 0.03448) = 3.772696 ms
    comm = target_forward(pcie_node, kimi, TP8, 1, 1, CONTEXT, use_graph=True).comm.ms
    expected = (123 * pcie_node.collective_ms(14_336, 8, True)
                + pcie_node.collective_ms(327_680, 8, False))
    assert comm == pytest.approx(expected)
    assert comm == pytest.approx(3.772696)


def test_attention_dp_gathers_instead_of_all_reducing(pcie_node, kimi):
    lp = LaunchParams(tp_size=8, enable_dp_attention=True)
    comm = target_forward(pcie_node, kimi, lp, 1, 1, CONTEXT, use_graph=True).comm.ms
    assert comm == pytest.approx(122 * 0.030196 + 0.03448)


def test_collective_bytes_scale_with_tokens_in_the_step(pcie_node, kimi):
    # 8 tokens: 123 x (0.030 + 1.75 x 114,688 / 64e9 x 1e3) + (0.030 + 0.875 x 2,621,440 / 64e9
    # x 1e3) = 123 x 0.033136 + 0.06584 = 4.141568 ms
    comm = target_forward(pcie_node, kimi, TP8, 1, 8, CONTEXT, use_graph=True).comm.ms
    assert comm == pytest.approx(4.141568)


# --- weights ---------------------------------------------------------------------------------


def test_dense_linear_layers_stay_memory_bound_up_to_about_200_tokens():
    node = Node(load_hardware("h200-sxm"), Efficiency())
    qwen, lp = load_model("qwen3-8b"), LaunchParams(tp_size=1)
    weights = {t: target_forward(node, qwen, lp, 1, t, 1024.0, True).gemm.ms
               for t in (1, 64, 128, 512)}
    assert weights[1] == weights[64] == weights[128]
    assert weights[512] > 1.5 * weights[1]


def test_more_tokens_a_step_read_more_experts_on_a_moe(pcie_node, kimi):
    weights = [target_forward(pcie_node, kimi, EP8, 1, n, CONTEXT, True).moe.ms
               for n in (1, 8, 16, 64)]
    assert weights == sorted(weights) and weights[2] > 2 * weights[0]


def test_ddtree_drafter_pays_for_its_tree_build_eagerly(pcie_node, kimi, model_backend):
    drafter = model_backend.drafter
    chain = LaunchParams(tp_size=8, speculative_algorithm="dflash")
    tree = LaunchParams(tp_size=8, speculative_algorithm="ddtree")
    host = [draft_forward(pcie_node, kimi, drafter, lp, 1, 3.6, CONTEXT, False).host
            for lp in (chain, tree)]
    # GEMMs: fusion, then qkv, o, gate_up, down in 6 layers (25); small kernels 6 x 7 (42);
    # 12 all-reduces and the logit gather (13); 20 a forward: 100 launches; DDTree adds 30:
    # 2.5 ms -> 3.25 ms
    assert host == pytest.approx([2.5, 3.25])


def test_a_chain_drafter_runs_one_pass_a_draft_token(pcie_node, kimi, model_backend):
    # EAGLE-3 / MTP: block 4 is three passes of one position a request, each paying its own
    # launches, collectives and LM head; only the first fuses the committed tokens' states.
    chain = dataclasses.replace(model_backend.drafter, chain=True)

    def draft(drafter, block):
        lp = LaunchParams(tp_size=8, speculative_algorithm="dflash",
                          speculative_dflash_block_size=block)
        return draft_forward(pcie_node, kimi, drafter, lp, 1, 2.0, CONTEXT, False)

    one, three = draft(chain, 2), draft(chain, 4)
    # First pass 100 launches (2.5 ms, as DFlash's one pass); the two later ones skip the
    # fusion GEMM: 99 each. 2.5 + 2 x 2.475 = 7.45 ms
    assert (one.host, three.host) == pytest.approx((2.5, 7.45))
    assert draft(model_backend.drafter, 4).host == pytest.approx(2.5)
    assert three.comm.ms == pytest.approx(3 * one.comm.ms)
    assert one.gemm.ms < three.gemm.ms < 3 * one.gemm.ms


def test_graph_padding_rows_read_no_kv_but_cost_wire_bytes(pcie_node, kimi):
    # 3 requests replayed in a 4-row graph: KV of 3 requests, all-reduces sized for 4 rows.
    real = target_forward(pcie_node, kimi, TP8, 3, 1, CONTEXT, use_graph=True)
    padded = target_forward(pcie_node, kimi, TP8, 3, 1, CONTEXT, use_graph=True, padded_batch=4)
    assert padded.attention.ms == pytest.approx(3 * 0.112646, rel=1e-5) == real.attention.ms
    assert padded.comm.ms > real.comm.ms


# --- small kernels ---------------------------------------------------------------------------


def test_small_kernel_counts_by_architecture_by_hand():
    # Qwen3-8B: 36 GQA layers (5) with dense MLPs (2), bf16
    assert load_model("qwen3-8b").small_kernels == 36 * (5 + 2)
    # DeepSeek-V3 FP8: 61 MLA layers (8 + 3 quant), 3 dense MLPs (2 + 2 quant),
    # 58 MoE blocks with a shared expert (5 + 1 + 2 quant)
    assert load_model("deepseek-v3-fp8").small_kernels == 61 * 11 + 3 * 4 + 58 * 8


def test_small_kernels_cost_their_count_times_the_engines_kernel_time():
    m = load_model("qwen3-8b")
    node = Node(load_hardware("rtx-pro-6000-server"), Efficiency(kernel_fixed_us=4.0))
    fwd = target_forward(node, m, LaunchParams(), 1, 1, CONTEXT, use_graph=True)
    assert fwd.small_kernels.ms == pytest.approx(252 * 4.0 / 1e3)
    none = Node(node.hw, Efficiency(kernel_fixed_us=0.0))
    bare = target_forward(none, m, LaunchParams(), 1, 1, CONTEXT, use_graph=True)
    assert fwd.device - bare.device == pytest.approx(fwd.small_kernels.ms)


def test_kernel_time_is_fitted_per_engine_family():
    hw = load_hardware("h200-sxm")
    assert hw.classes("vllm")["kernel_fixed_us"] == "vllm"
    assert hw.classes("vllm-0.11")["kernel_fixed_us"] == "vllm"
    assert hw.classes("sglang")["kernel_fixed_us"] == "sglang"
    both = hw.classes("vllm"), hw.classes("sglang")
    assert both[0]["bandwidth_efficiency"] == both[1]["bandwidth_efficiency"]


# --- a CPU host ------------------------------------------------------------------------------


def test_a_cpu_host_pays_its_dispatch_time_on_top_of_the_kernels_it_runs():
    """On the CPU the host runs the kernels it dispatches: no overlap, so the whole dispatch
    time adds to the device time (on a GPU only the part beyond it would)."""
    from backends.deployment import Deployment
    from backends.flags import LaunchTarget

    dep = Deployment(gpu="cpu-2core-vm", gpus=1, model="fixtures/tiny_code/target/config.json",
                     target=LaunchTarget(model_path="t", drafter_path="d"))
    backend = PerfModelBackend(dep, Efficiency())
    setup = backend.setup(LaunchParams(tp_size=1, cuda_graph=False), Workload(32, 32, (1,)))
    parts = step_breakdown(setup, 1, 48.0)
    fwd = target_forward(setup.node, setup.model, setup.lp, 1, 1, 48.0, use_graph=False)
    assert parts["host_exposed"] == pytest.approx(fwd.host)
    assert sum(parts.values()) == pytest.approx(fwd.device + fwd.host)
    gpu = Node(load_hardware("rtx-pro-6000-server"), Efficiency())
    assert not setup.node.hw.host_overlaps_device and gpu.hw.host_overlaps_device


# --- a round-capped DDTree -------------------------------------------------------------------


def test_a_round_capped_tree_is_predicted_as_the_tree_each_batch_runs(pcie8_reference):
    """The model runs what the engine runs (Spec.at_rows): the whole budget at one request, a
    smaller tree, verify and acceptance both, at more. (Our serve has the cap; SGLang not.)"""
    deployment = dataclasses.replace(pcie8_reference.deployment, engine="dflash")
    model_backend = PerfModelBackend(deployment, Efficiency())
    tree = dict(speculative_algorithm="ddtree", speculative_dflash_block_size=8,
                speculative_ddtree_topk=4)
    capped = _setup(model_backend, **tree, speculative_ddtree_budget=32,
                    speculative_ddtree_round_tokens=128)
    workload = Workload(1024, 512, (1,))
    for concurrency, budget in ((1, 32), (4, 31), (16, 7), (64, 7)):
        fixed = _setup(model_backend, **tree, speculative_ddtree_budget=budget)
        got, want = predict(capped, workload, concurrency), predict(fixed, workload, concurrency)
        assert got.output_tok_s == pytest.approx(want.output_tok_s), concurrency
        assert got.accept_len_mean == pytest.approx(want.accept_len_mean), concurrency
    uncapped = _setup(model_backend, **tree, speculative_ddtree_budget=32)
    assert predict(capped, workload, 16).accept_len_mean < \
        predict(uncapped, workload, 16).accept_len_mean
