"""Why a server (or an in-process engine) failed, read from its exit status and its log."""

from __future__ import annotations

import re

from backends.contract import FailureClass

# Checked top to bottom, first match wins, so the order is the policy:
#   1. OOM first: an OOM often surfaces as a crash, a ValueError or a worker killed later on.
#   2. PORT_IN_USE: a bind conflict (HTTP or torch.distributed port) passes on another port.
#   3. UNSUPPORTED before INVALID_CONFIG: "ValueError: X is not supported" is the feature's fault.
#      Only error lines count, so a startup warning "... not supported, falling back" does not.
#   4. INVALID_CONFIG: argparse usage errors, pydantic config validation, a final ValueError.
#   5. TRANSIENT last among patterns: a reset connection is often the echo of a crashed peer.
# Then the exit status: 2 (argparse) -> INVALID_CONFIG; a signal or anything else -> CRASH
# (a server exiting 0 before it was stopped is a crash too).
_ERROR_LINE = r"(?m)^\s*(?:[\w.]*(?:Error|Exception)|error)\b[^\n]*"
_PATTERNS: tuple[tuple[FailureClass, str], ...] = (
    (FailureClass.OOM, r"CUDA out of memory|OutOfMemoryError|CUDA error: out of memory"),
    (FailureClass.OOM, r"Not enough memory|No available memory for the cache blocks"),
    (FailureClass.OOM, r"CUBLAS_STATUS_ALLOC_FAILED|cudaErrorMemoryAllocation"),
    (FailureClass.OOM, r"larger than the maximum number of tokens that can be stored in KV cache"),
    # vLLM: the KV cache cannot hold one request of --max-model-len (a ValueError, so before
    # INVALID_CONFIG's catch-all): more memory, or a shorter context, fixes it.
    (FailureClass.OOM, r"KV cache is needed, which is larger than the available KV cache memory"),
    # Host memory (CPU engines): torch's allocator, the C++ runtime, Python.
    (FailureClass.OOM, r"DefaultCPUAllocator:\s+can't allocate memory|std::bad_alloc|MemoryError"),
    # Our engine's own refusal, before it allocates (backends.engine_limits).
    (FailureClass.OOM, r"(?m)^(?:[\w.]+\.)?WontFit:"),
    (FailureClass.PORT_IN_USE, r"Address already in use|EADDRINUSE|\[Errno 98\]"),
    (FailureClass.UNSUPPORTED, r"NotImplementedError|Unknown speculative algorithm"),
    (FailureClass.UNSUPPORTED, _ERROR_LINE + r"(?:not (?:yet )?supported|\bunsupported\b)"),
    (FailureClass.INVALID_CONFIG, r"error: (?:unrecognized arguments|argument |ambiguous option)"),
    (FailureClass.INVALID_CONFIG, r"invalid choice|error: the following arguments are required"),
    (FailureClass.INVALID_CONFIG, r"ValidationError: \d+ validation errors? for"),
    (FailureClass.INVALID_CONFIG, r"(?m)^(?:[\w.]+\.)?ValueError:"),
    # Our engine's user errors (backends.errors.UserError and its kinds).
    (FailureClass.INVALID_CONFIG,
     r"(?m)^(?:[\w.]+\.)?(?:UserError|InvalidParams|UnsupportedParams|CheckpointError):"),
    (FailureClass.TRANSIENT, r"Connection reset by peer|ConnectionResetError|ECONNRESET"),
    (FailureClass.TRANSIENT, r"Temporary failure in name resolution"),
)
_COMPILED = tuple((failure, re.compile(pattern)) for failure, pattern in _PATTERNS)
_ARGPARSE_EXIT = 2


def classify(exit_code: int | None, log_text: str) -> FailureClass:
    """Why a server failed, from its exit status (negative: killed by that signal; None: not
    known) and its log. Pure; the table above is the whole policy."""
    for failure, pattern in _COMPILED:
        if pattern.search(log_text):
            return failure
    if exit_code == _ARGPARSE_EXIT:
        return FailureClass.INVALID_CONFIG
    return FailureClass.CRASH
