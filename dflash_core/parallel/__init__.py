"""The engine over several ranks: tensor parallelism for attention, MLPs, embedding and LM head,
expert parallelism for routed experts (torch.distributed: NCCL on CUDA, gloo on the CPU).

    layout.py   which slice each rank holds (Layout: SGLang's --tp N --ep M)
    comm.py     the collectives, counted by kind (Traffic) into the engine's stats
    modules.py  the shard modules (row-parallel linear, vocab-parallel embedding / head, experts)
    modules_deepseek.py  the DeepSeek MoE's (INT4 experts, one all-reduce with the shared ones)
    shard.py    a target loaded straight into this rank's shards; Qwen3's plan
    shard_deepseek.py    DeepSeek-V3 / Kimi K2's plan (MLA split by head, latent replicated)
    shard_parts.py       what the plans share (slices, vocabulary, SwiGLU MLP)
    mirror.py   rank 0 sends each batch call's host inputs; the other ranks replay them
    ranks.py    starting the ranks (processes), and stopping all of them when one dies

Every rank runs the same round on the same inputs; rank 0 alone talks to the outside.
"""
