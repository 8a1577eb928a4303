"""Hardware and model facts the performance model reasons with.

Models come from the shipped catalog (``models.yaml``) or any HF ``config.json`` (DeepSeek-V3 /
Kimi MLA layouts, Qwen3 dense and MoE, Kimi-K3's hybrid of KDA linear attention and MLA with
LatentMoE experts); GPUs and interconnects from ``hardware.yaml``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from backends.errors import UserError
from backends.perf_model.constants import SMALL_KERNELS, fit_classes
from backends.perf_model.shapes import Linear, drafter_linears, target_linears

_HERE = Path(__file__).parent
BF16_BYTES = 2
FP32_BYTES = 4


class CatalogError(UserError):
    """An unknown catalog name or an unreadable model config."""


@dataclass(slots=True, frozen=True)
class Hardware:
    name: str
    memory_gib: float
    bandwidth_gbs: float
    bf16_tflops: float
    interconnect: str
    link_gbs: float
    collective_latency_us: float
    memory: str = "hbm3e"  # memory kind: its achieved bandwidth efficiency is fitted per kind
    # A GPU runs kernels while the host launches the next ones; a CPU host does both itself.
    host_overlaps_device: bool = True
    # The system whose measured kernel tables time this GPU's kernels (kernels/tables.py);
    # empty: none, every term is a roofline.
    measured_system: str = ""
    # CUDA compute capability (10.0 for B200); 0 for a CPU. Engines pick kernels by it.
    compute_capability: float = 0.0
    # The L2 cache in MiB, where the catalog has it (0: not known). A kernel benchmark that reruns
    # one layer whose weights fit in it reads them from the cache, a serving step never does.
    l2_mib: float = 0.0

    def classes(self, engine: str) -> dict[str, str]:
        """The class each fitted constant of this GPU, under ``engine``, is shared within."""
        return fit_classes(self.memory, self.interconnect, engine)


@dataclass(slots=True, frozen=True)
class LinearAttention:
    """Linear-attention layers of a hybrid model (Kimi Delta Attention, KDA): each keeps a
    fixed recurrent state a request (``heads`` matrices of ``head_dim`` x ``head_dim``, fp32,
    plus a short convolution's last ``conv_kernel - 1`` inputs of q, k and v in bf16) instead
    of a KV cache that grows with context."""

    layers: int
    heads: int
    head_dim: int
    conv_kernel: int

    def state_bytes(self, tp: int) -> float:
        """One request's state, all these layers, on one of ``tp`` ranks (heads are split)."""
        width = self.heads * self.head_dim
        recurrent = width * self.head_dim * FP32_BYTES
        conv = (self.conv_kernel - 1) * 3 * width * BF16_BYTES
        return self.layers * (recurrent + conv) / min(tp, self.heads)


@dataclass(slots=True, frozen=True)
class ModelArch:
    """Parameter counts and KV size of a decoder, derived from HF config fields."""

    name: str
    num_layers: int
    num_dense_layers: int  # leading layers with a dense MLP (all of them for a dense model)
    hidden: int
    vocab: int
    attn_params_per_layer: int
    dense_mlp_params: int  # per dense layer
    num_experts: int
    top_k: int
    expert_params: int  # one routed expert (gate, up, down)
    shared_expert_params: int  # per MoE layer
    expert_weight_bits: float
    kv_bytes_per_token_layer: int  # bf16; MLA latent or GQA K+V
    kv_heads: int  # 0 for MLA: its latent is shared by all heads, so TP replicates it
    attn_flops_per_token_ctx_layer: int  # score + value FLOPs per (token, context token, layer)
    tied_embeddings: bool = False  # the LM head is the embedding table (small Qwen3s)
    # Bits a non-expert linear weight costs (attention, dense and shared MLPs): 16 for bf16, 8
    # for FP8 checkpoints (DeepSeek-V3, Kimi-K2-Instruct), whose embedding and LM head stay bf16.
    dense_weight_bits: float = 16
    # The routed experts' number format where bits alone do not say it: "mxfp4" (4-bit floats,
    # 8-bit shared exponents: Kimi-K3, gpt-oss), empty for integer or unquantised experts.
    expert_format: str = ""
    # Zipf exponent of expert popularity (routing.py); 0 = uniform routing.
    routing_skew: float = 0.0
    linears: tuple[Linear, ...] = ()  # the non-expert GEMMs of a forward (shapes.py)
    num_heads: int = 0  # attention (query) heads
    head_dim: int = 0  # GQA head dimension (0 for MLA)
    # Width the routed experts compute in: the hidden size, or a LatentMoE's latent (Kimi-K3:
    # 3584), which a down and an up projection (in ``linears``) join to the hidden stream.
    expert_hidden: int = 0
    # The layers that are linear attention (no KV cache); None: every layer is full attention.
    linear_attention: LinearAttention | None = None
    # The HF config's ``architectures[0]`` (engines pick code paths and defaults by it).
    architecture: str = ""

    @property
    def num_moe_layers(self) -> int:
        return self.num_layers - self.num_dense_layers

    @property
    def num_attention_layers(self) -> int:
        """Layers with full attention and a KV cache (all but the linear-attention ones)."""
        return self.num_layers - (self.linear_attention.layers if self.linear_attention else 0)

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def dense_params(self) -> int:
        """Everything that is not a routed expert: attention, dense/shared MLPs, LM head."""
        return self.linear_params + self.vocab * self.hidden

    @property
    def linear_params(self) -> int:
        """Non-expert linear weights, the LM head excluded (those ``dense_weight_bits`` cover)."""
        if self.linears:
            return sum(x.params for x in self.linears if x.name != "lm_head")
        return (self.num_layers * self.attn_params_per_layer
                + self.num_dense_layers * self.dense_mlp_params
                + self.num_moe_layers * self.shared_expert_params)

    @property
    def dense_bytes(self) -> float:
        """Bytes a forward streams for the non-expert weights (the LM head in bf16)."""
        return (self.linear_params * self.dense_weight_bits / 8
                + self.vocab * self.hidden * BF16_BYTES)

    @property
    def small_kernels(self) -> int:
        """Non-GEMM kernels of one forward (constants.SMALL_KERNELS, by block)."""
        k, fp8 = SMALL_KERNELS, self.dense_weight_bits <= 8
        if self.kv_heads == 0:  # MLA
            attn = k["mla"] + fp8 * k["fp8_mla"]
        else:
            attn = k["gqa"] + fp8 * k["fp8_gqa"]
        mlp = k["dense_mlp"] + fp8 * k["fp8_mlp"]
        moe = (k["moe"] + bool(self.shared_expert_params) * k["shared_expert"]
               + fp8 * k["fp8_mlp"])
        return self.num_layers * attn + self.num_dense_layers * mlp + self.num_moe_layers * moe

    @property
    def eager_launches(self) -> int:
        """Kernels one forward launches, its collectives aside: every GEMM (an absorbed MLA
        ``kv_b`` runs as the two batched GEMMs counted among the small kernels), the two grouped
        expert GEMMs of each MoE layer, and the small kernels."""
        gemms = sum(x.per_forward for x in self.linears if not x.heads)
        return gemms + 2 * self.num_moe_layers + self.small_kernels

    @property
    def moe_hidden(self) -> int:
        """The width a routed expert's input and output have (the MoE tables' hidden size)."""
        return self.expert_hidden or self.hidden

    @property
    def moe_inter(self) -> int:
        """One routed expert's intermediate size."""
        return self.expert_params // (3 * self.moe_hidden) if self.expert_params else 0

    @property
    def expert_bytes(self) -> float:
        return self.expert_params * self.expert_weight_bits / 8

    @property
    def weight_bytes(self) -> float:
        """Bytes resident in GPU memory (embedding table included, once if tied)."""
        routed = self.num_moe_layers * self.num_experts * self.expert_bytes
        embedding = 0 if self.tied_embeddings else self.vocab * self.hidden
        return self.dense_bytes + embedding * BF16_BYTES + routed


@dataclass(slots=True, frozen=True)
class DrafterArch:
    """A drafter of Qwen3-style layers sharing the target's embedding and LM head: DFlash's
    (one pass over the block) or a chain drafter's (``chain``: EAGLE-3 or MTP, one pass a
    draft token)."""

    num_layers: int
    hidden: int
    params_per_layer: int
    fc_params: int  # fuses the tapped target layers' hidden states into one
    kv_heads: int
    kv_bytes_per_token_layer: int
    attn_flops_per_token_ctx_layer: int
    block_size: int
    linears: tuple[Linear, ...] = ()  # the drafter's GEMMs (shapes.py)
    num_heads: int = 0
    head_dim: int = 0
    chain: bool = False

    @property
    def weight_bytes(self) -> float:
        return (self.num_layers * self.params_per_layer + self.fc_params) * BF16_BYTES

    @property
    def small_kernels(self) -> int:
        """Qwen3-style bf16 layers: GQA attention and a dense MLP (constants.SMALL_KERNELS)."""
        return self.num_layers * (SMALL_KERNELS["gqa"] + SMALL_KERNELS["dense_mlp"])

    def pass_linears(self, fuses: bool) -> tuple[Linear, ...]:
        """The GEMMs of one pass: a pass that fuses no committed tokens' target states (a chain
        drafter's later passes) skips the fusion."""
        return self.linears if fuses else tuple(x for x in self.linears if x.name != "fc")

    def eager_launches(self, fuses: bool = True) -> int:
        """Kernels one drafter pass launches, its collectives and the shared LM head aside."""
        return sum(x.per_forward for x in self.pass_linears(fuses)) + self.small_kernels


@cache
def _catalog(file: str) -> dict[str, Any]:
    return yaml.safe_load((_HERE / file).read_text())


def hardware_names() -> list[str]:
    return sorted(_catalog("hardware.yaml")["gpus"])


def model_names() -> list[str]:
    return sorted(_catalog("models.yaml")["models"])


def load_hardware(name: str) -> Hardware:
    cat = _catalog("hardware.yaml")
    if name not in cat["gpus"]:
        raise CatalogError(f"unknown GPU {name!r}; known: {', '.join(hardware_names())}")
    gpu = cat["gpus"][name]
    link = cat["interconnects"][gpu["interconnect"]]
    return Hardware(name=name, **gpu, **link)


def load_model(name_or_path: str) -> ModelArch:
    """A catalog name (``kimi-k2.6``) or a path to an HF ``config.json`` or its folder."""
    models = _catalog("models.yaml")["models"]
    if name_or_path in models:
        return model_from_config(name_or_path, models[name_or_path])
    path = Path(name_or_path)
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise CatalogError(f"model {name_or_path!r} is neither a catalog name "
                           f"({', '.join(model_names())}) nor a config.json path")
    try:
        config = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise CatalogError(f"{path}: not valid JSON ({err})") from err
    if not isinstance(config, dict):
        raise CatalogError(f"{path}: must hold a JSON object of config fields, not a "
                           f"{type(config).__name__}")
    return model_from_config(str(path.parent.name), config)


# The sizes a model the catalog can price may have (the largest public configs hold vocab
# ~260k, hidden 16k-25k, ~130 layers, 128 heads, 512 experts, with room to spare): beyond them a
# value is a typo or a damaged file, and would make every estimate meaningless or slow.
SIZE_BOUNDS = {"vocab_size": 1 << 22, "hidden_size": 1 << 17, "intermediate_size": 1 << 20,
               "moe_intermediate_size": 1 << 20, "num_hidden_layers": 1024,
               "num_attention_heads": 4096, "num_key_value_heads": 4096, "head_dim": 4096,
               "num_experts": 1 << 14, "n_routed_experts": 1 << 14,
               "num_experts_per_tok": 1 << 14, "kv_lora_rank": 1 << 16, "q_lora_rank": 1 << 16}


def model_from_config(name: str, cfg: dict[str, Any]) -> ModelArch:
    if "text_config" in cfg:  # Kimi K2.5/K2.6 nest the language model; quantisation may sit outside
        cfg = {"quantization_config": cfg.get("quantization_config"),
               "architectures": cfg.get("architectures"), **cfg["text_config"]}
    _check_sizes(name, cfg)
    try:
        return _arch(name, cfg)
    except KeyError as err:
        raise CatalogError(f"model config {name!r} lacks field {err.args[0]!r}") from err


def _check_sizes(name: str, cfg: dict[str, Any]) -> None:
    for field, high in SIZE_BOUNDS.items():
        value = cfg.get(field)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= high:
            raise CatalogError(f"model config {name!r}: {field} must be an integer in "
                               f"0..{high}, got {value!r}")


def _arch(name: str, c: dict[str, Any]) -> ModelArch:
    hidden, layers = c["hidden_size"], c["num_hidden_layers"]
    experts = c.get("n_routed_experts") or c.get("num_experts") or 0
    moe_inter = c.get("moe_intermediate_size", 0)
    expert_hidden = c.get("routed_expert_hidden_size") or 0
    linear_attention = _linear_attention(c)  # checked before its shapes are read
    dense_layers = c.get("first_k_dense_replace", 0) if experts else layers
    attn, kv_bytes, kv_heads, attn_flops = _attention(c, hidden)
    dense_bits = c.get("dense_weight_bits") or _fp8_dense_bits(c) or 16
    top_k = c.get("num_experts_per_tok") or c.get("num_experts_per_token") or 0
    shared = c.get("n_shared_experts") or c.get("num_shared_experts") or 0
    return ModelArch(
        name=name, num_layers=layers, num_dense_layers=dense_layers, hidden=hidden,
        vocab=c["vocab_size"], attn_params_per_layer=attn,
        dense_mlp_params=3 * hidden * c["intermediate_size"],
        num_experts=experts, top_k=top_k if experts else 0,
        expert_params=3 * (expert_hidden or hidden) * moe_inter,
        shared_expert_params=3 * hidden * moe_inter * shared,
        expert_weight_bits=(c.get("expert_weight_bits") or _quantized_bits(c) or _fp8_dense_bits(c)
                            or 16),
        expert_format=c.get("expert_format") or _quantized_format(c),
        kv_bytes_per_token_layer=kv_bytes, kv_heads=kv_heads,
        attn_flops_per_token_ctx_layer=attn_flops,
        tied_embeddings=bool(c.get("tie_word_embeddings", False)),
        dense_weight_bits=dense_bits, routing_skew=_routing_skew(c),
        linears=target_linears(c, dense_bits), num_heads=c["num_attention_heads"],
        head_dim=0 if kv_heads == 0 else (c.get("head_dim") or hidden // c["num_attention_heads"]),
        expert_hidden=expert_hidden, linear_attention=linear_attention,
        architecture=(c.get("architectures") or [""])[0],
    )


def _linear_attention(c: dict[str, Any]) -> LinearAttention | None:
    """Kimi Linear / Kimi-K3's ``linear_attn_config``: its KDA layers, heads and head width."""
    la = c.get("linear_attn_config")
    if not la or not la.get("kda_layers"):
        return None
    out = LinearAttention(layers=len(la["kda_layers"]), heads=la["num_heads"],
                          head_dim=la["head_dim"], conv_kernel=la.get("short_conv_kernel_size", 4))
    if out.layers >= c["num_hidden_layers"] or not all(
            isinstance(v, int) and 0 < v <= SIZE_BOUNDS["head_dim"]
            for v in (out.heads, out.head_dim, out.conv_kernel)):
        raise CatalogError(f"linear_attn_config: {len(la['kda_layers'])} KDA layers of "
                           f"{c['num_hidden_layers']}, num_heads, head_dim and "
                           f"short_conv_kernel_size must be positive integers up to "
                           f"{SIZE_BOUNDS['head_dim']}, got {la}")
    return out


def _routing_skew(c: dict[str, Any]) -> float:
    skew = float(c.get("routing_skew", 0.0))
    if skew < 0:
        raise CatalogError(f"routing_skew must be >= 0 (0 = uniform routing), got {skew}")
    return skew


def _quantized_bits(c: dict[str, Any]) -> float | None:
    """Bits a routed-expert weight costs under a compressed-tensors config: the packed value
    plus one scale a group, bf16 unless the config says 8-bit (Kimi K2.6's INT4: 4 + 16/32 =
    4.5; Kimi-K3's MXFP4 with uint8 exponent scales: 4 + 8/32 = 4.25). Such checkpoints quantise
    the routed experts only, keeping attention, shared experts and embeddings in bf16."""
    quant = c.get("quantization_config") or {}
    for group in (quant.get("config_groups") or {}).values():
        weights = group.get("weights") or {}
        if weights.get("num_bits"):
            size = weights.get("group_size")
            scale = str(weights.get("scale_dtype") or "")
            scale_bits = 8 if "int8" in scale or "float8" in scale else 16
            return weights["num_bits"] + (scale_bits / size if size else 0)
    return None


def _quantized_format(c: dict[str, Any]) -> str:
    """``mxfp4`` for an MXFP4 compressed-tensors checkpoint, else empty (integer or none)."""
    quant = c.get("quantization_config") or {}
    return "mxfp4" if "mxfp4" in str(quant.get("format", "")) else ""


def _fp8_dense_bits(c: dict[str, Any]) -> float | None:
    """An FP8 checkpoint (``quant_method: fp8``, DeepSeek-V3 style) stores every linear weight,
    experts included, in 8 bits; embedding and LM head stay bf16."""
    quant = c.get("quantization_config") or {}
    return 8.0 if quant.get("quant_method") == "fp8" else None


def _attention(c: dict[str, Any], hidden: int) -> tuple[int, int, int, int]:
    """(params per layer, KV bytes per token per layer, KV heads, FLOPs per token x context)."""
    heads = c["num_attention_heads"]
    if "kv_lora_rank" in c:  # MLA, decode with absorbed projections
        q_lora, kv_lora = c.get("q_lora_rank") or hidden, c["kv_lora_rank"]
        rope, nope, v = c["qk_rope_head_dim"], c["qk_nope_head_dim"], c["v_head_dim"]
        params = (hidden * q_lora + q_lora * heads * (nope + rope) + hidden * (kv_lora + rope)
                  + kv_lora * heads * (nope + v) + heads * v * hidden)
        if c.get("mla_use_output_gate"):
            params += heads * v * hidden
        latent = kv_lora + rope
        return params, latent * BF16_BYTES, 0, 2 * heads * (latent + kv_lora)
    head_dim = c.get("head_dim") or hidden // heads
    kv_heads = c.get("num_key_value_heads", heads)
    params = 2 * hidden * heads * head_dim + 2 * hidden * kv_heads * head_dim
    return params, 2 * kv_heads * head_dim * BF16_BYTES, kv_heads, 4 * heads * head_dim


def drafter_arch(target: ModelArch, num_layers: int, num_target_layers: int, block_size: int,
                 heads: int = 32, kv_heads: int = 8, head_dim: int = 128,
                 intermediate: int | None = None, chain: bool = False) -> DrafterArch:
    """A drafter for ``target``: hidden size is the target's, FC input is the taps."""
    hidden = target.hidden
    inter = intermediate or 3 * hidden
    attn = 2 * hidden * heads * head_dim + 2 * hidden * kv_heads * head_dim
    return DrafterArch(
        num_layers=num_layers, hidden=hidden, params_per_layer=attn + 3 * hidden * inter,
        fc_params=num_target_layers * hidden * hidden, kv_heads=kv_heads,
        kv_bytes_per_token_layer=2 * kv_heads * head_dim * BF16_BYTES,
        attn_flops_per_token_ctx_layer=4 * heads * head_dim, block_size=block_size,
        linears=drafter_linears(hidden, num_layers, num_target_layers, heads, kv_heads,
                                head_dim, inter),
        num_heads=heads, head_dim=head_dim, chain=chain,
    )
