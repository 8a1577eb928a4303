"""Build the tiny target + DFlash drafter pair from scratch, reproducibly (fixed seeds).

Steps: corpus (stdlib source) -> BPE tokenizer -> target LM -> target-regenerated responses ->
DFlash drafter -> held-out prompts -> acceptance check. Everything is written in the public
layouts (`target/`, `drafter/`, HF config + safetensors + tokenizer.json) plus a manifest with
the recipe, losses, timings and measured acceptance.
"""

from __future__ import annotations

import json
import platform
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from dflash_core.models.config import DrafterConfig, ModelConfig
from dflash_core.models.drafter import Drafter
from dflash_core.models.loader import save_model
from dflash_core.models.target import Target
from dflash_core.training.corpus import load_corpus
from dflash_core.training.drafter_train import default_gamma, regenerate, train_drafter
from dflash_core.training.evaluate import acceptance_report
from dflash_core.training.optim import Schedule, init_weights
from dflash_core.training.target_train import held_out_loss, sample_windows, train_target
from dflash_core.training import hf_layout
from dflash_core.training.tokenizer import MASK, encode_files, train_tokenizer

Progress = Callable[[str, int, int, float | None], None]  # stage, step, total, loss


@dataclass(slots=True)
class Recipe:
    """Every knob of the build; stored in the manifest."""

    seed: int = 0
    corpus_chars: int = 4_000_000
    vocab_size: int = 2048
    hidden_size: int = 192
    target_layers: int = 5
    heads: int = 6
    kv_heads: int = 2
    intermediate_size: int = 576
    target_schedule: Schedule = field(default_factory=lambda: Schedule(150, 32, 128, 3e-3))
    drafter_layers: int = 1
    block_size: int = 8
    taps: list[int] = field(default_factory=lambda: [1, 3, 4])
    prompts: int = 1024
    prompt_len: int = 64
    response_len: int = 64
    drafter_schedule: Schedule = field(default_factory=lambda: Schedule(400, 16, 0, 3e-3))
    anchors_per_seq: int = 16
    eval_prompts: int = 32
    save_dtype: str = "bfloat16"  # halves the shipped size; loads into fp32 for tests

    def layer_config(self, layers: int) -> ModelConfig:
        return ModelConfig(vocab_size=self.vocab_size, hidden_size=self.hidden_size,
                           intermediate_size=self.intermediate_size, num_hidden_layers=layers,
                           num_attention_heads=self.heads, num_key_value_heads=self.kv_heads,
                           head_dim=self.hidden_size // self.heads, rope_theta=10_000.0,
                           tie_word_embeddings=True)


def build_pair(out: str | Path, recipe: Recipe | None = None,
               progress: Progress | None = None) -> dict:
    recipe, out = recipe or Recipe(), Path(out)
    began, timings = time.perf_counter(), {}
    torch.manual_seed(recipe.seed)
    corpus = load_corpus(recipe.corpus_chars)
    tokenizer = train_tokenizer(corpus.train, recipe.vocab_size)
    _report(progress, "tokenizer", 1, 1)
    train_ids = torch.tensor(_encode(tokenizer, corpus.train, progress))
    held_ids = torch.tensor(encode_files(tokenizer, corpus.held_out))
    timings["corpus_and_tokenizer_s"] = time.perf_counter() - began

    target = Target(recipe.layer_config(recipe.target_layers))
    init_weights(target)
    target_losses = train_target(target, train_ids, recipe.target_schedule, recipe.seed,
                                 _stage(progress, "target", recipe.target_schedule.steps))
    timings["target_s"] = time.perf_counter() - began - sum(timings.values())

    drafter, drafter_losses = _drafter(recipe, target, train_ids, tokenizer, progress)
    timings["drafter_s"] = time.perf_counter() - began - sum(timings.values())

    prompts = sample_windows(held_ids, recipe.eval_prompts, recipe.prompt_len,
                             torch.Generator().manual_seed(recipe.seed + 2)).tolist()
    _save(out, target, drafter, tokenizer, prompts, recipe.save_dtype)
    manifest = _manifest(recipe, target_losses, drafter_losses, timings,
                         held_out_loss(target, held_ids, recipe.target_schedule.seq_len))
    _report(progress, "acceptance", 0, 1)
    manifest["acceptance"] = acceptance_report(out)
    _report(progress, "acceptance", 1, 1)
    manifest["build_seconds"] = round(time.perf_counter() - began, 1)
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2))
    return manifest


def _drafter(recipe: Recipe, target: Target, train_ids: torch.Tensor, tokenizer,
             progress: Progress | None) -> tuple[Drafter, list[float]]:
    windows = sample_windows(train_ids, recipe.prompts, recipe.prompt_len,
                             torch.Generator().manual_seed(recipe.seed + 1))
    _report(progress, "regenerate", 0, 1)
    data = regenerate(target, windows, recipe.response_len, recipe.taps)
    _report(progress, "regenerate", 1, 1)
    config = DrafterConfig(recipe.layer_config(recipe.drafter_layers), recipe.block_size,
                           list(recipe.taps), tokenizer.token_to_id(MASK))
    drafter = Drafter(config)
    init_weights(drafter)
    losses = train_drafter(drafter, target, data, recipe.drafter_schedule,
                           recipe.anchors_per_seq, default_gamma(recipe.block_size),
                           recipe.seed, _stage(progress, "drafter", recipe.drafter_schedule.steps))
    return drafter, losses


def _save(out: Path, target: Target, drafter: Drafter, tokenizer, prompts: list[list[int]],
          dtype: str) -> None:
    for name, model in (("target", target), ("drafter", drafter)):
        save_model(model.to(getattr(torch, dtype)), out / name)
        model.float()  # the saved (rounded) weights are what every later measurement loads
    tokenizer.save(str(out / "target" / "tokenizer.json"))
    (out / "heldout_prompts.json").write_text(json.dumps(prompts))
    hf_layout.complete(out)


def _manifest(recipe: Recipe, target_losses: list[float], drafter_losses: list[float],
              timings: dict[str, float], held_loss: float) -> dict:
    return {
        "recipe": asdict(recipe),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "platform": f"{platform.system()} {platform.machine()}",
        "target_loss": {"first": target_losses[0], "last10": _mean(target_losses[-10:]),
                        "held_out": held_loss},
        "drafter_loss": {"first": drafter_losses[0], "last10": _mean(drafter_losses[-10:])},
        "timings_s": {k: round(v, 1) for k, v in timings.items()},
    }


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def _encode(tokenizer, texts: list[str], progress: Progress | None,
            files_per_call: int = 32) -> list[int]:
    """``encode_files`` a few files per call: the same ids, and Ctrl-C (which Python sees only
    between calls into the tokenizer's native code) is seen within a fraction of a second
    instead of after the whole corpus."""
    ids: list[int] = []
    chunks = range(0, len(texts), files_per_call)
    for done, start in enumerate(chunks, 1):
        ids += encode_files(tokenizer, texts[start:start + files_per_call])
        _report(progress, "encode", done, len(chunks))
    return ids


def _report(progress: Progress | None, stage: str, step: int, total: int) -> None:
    if progress is not None:
        progress(stage, step, total, None)


def _stage(progress: Progress | None, name: str, total: int):
    if progress is None:
        return None
    return lambda step, loss: progress(name, step + 1, total, loss)
