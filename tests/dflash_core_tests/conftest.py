"""dflash_core tests run tiny models: one intra-op thread per test process.

With pytest-xdist on a 2-core runner, two workers each spinning two OpenMP threads oversubscribe
the CPU and every parallel kernel waits milliseconds for a descheduled thread (seen here: 7 ms
per bmm of a few hundred FLOPs). Tiny tensors gain nothing from threads anyway."""

from __future__ import annotations

import torch

torch.set_num_threads(1)
