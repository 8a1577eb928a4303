"""What a checkpoint is and how its forward runs: configs, loading, the target and the drafter,
their layers, attention, the static KV cache and the per-forward `Step`. Imports nothing from
speculation/ or runtime/."""
