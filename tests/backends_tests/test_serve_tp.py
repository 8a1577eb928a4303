"""`dflash-tune serve --tp-size 2`: a real server whose target is split over two rank processes
answers completions with the single-device greedy tokens and their log-probabilities; killing
one rank takes the whole server down (a crash for the tuner), leaves no rank process behind and
frees the port."""

from __future__ import annotations

import socket
import sys

import httpx
import psutil
import pytest
import torch
from tokenizers import Tokenizer

from backends.contract import FailureClass
from backends.failure_log import classify
from backends.server import ServerSpec, free_port, launched
from dflash_core import SamplingParams, Spec, build_engine, load_models
from dflash_core.runtime.scratch import ScratchSequence
from dflash_core.training.evaluate import held_out_prompts
from dflash_core.training.pair import ensure_pair

PAIR = ensure_pair()
PROMPTS = [held_out_prompts(PAIR)[i][:n] for i, n in ((0, 24), (1, 9))]
TOKENS = 12


def _single_device_tokens() -> tuple[list[list[int]], list[list[float]]]:
    """The greedy tokens of each prompt and the target's log-probability of each of them."""
    target, drafter = load_models(PAIR / "target", PAIR / "drafter")
    engine = build_engine(target, drafter, max_batch=2, max_context=64, max_tree_nodes=8)
    with torch.inference_mode():
        tokens = engine.generate(PROMPTS, SamplingParams(max_tokens=TOKENS), Spec.none()).tokens
        logprobs = []
        for prompt, out in zip(PROMPTS, tokens):
            logits = ScratchSequence(target, 64).feed(prompt + out[:-1])[len(prompt) - 1:]
            chosen = logits.log_softmax(-1).gather(1, torch.tensor(out)[:, None])[:, 0]
            logprobs.append(chosen.tolist())
    return tokens, logprobs


def _rank_processes(pid: int) -> list[psutil.Process]:
    """The server's descendants that run our ranks (the fork server's children)."""
    return [p for p in psutil.Process(pid).children(recursive=True)
            if "forkserver" in " ".join(p.cmdline()) and p.parent().pid != pid]


@pytest.mark.slow
def test_tp2_server_answers_with_single_device_tokens_and_dies_whole_with_a_rank(tmp_path):
    port = free_port()
    argv = [sys.executable, "-m", "backends.dflash_server", "--target", str(PAIR / "target"),
            "--drafter", str(PAIR / "drafter"), "--method", "ddtree", "--budget", "10",
            "--tp-size", "2", "--max-running-requests", "2", "--max-context", "256",
            "--port", str(port)]
    log = tmp_path / "server.log"
    spec = ServerSpec(argv, port, start_timeout_s=120, stop_timeout_s=5, log_path=log)
    expected, expected_logprobs = _single_device_tokens()
    tokenizer = Tokenizer.from_file(str(PAIR / "target" / "tokenizer.json"))
    with launched(spec) as server, httpx.Client(base_url=server.base_url, timeout=60,
                                                trust_env=False) as client:
        for prompt, tokens, logprobs in zip(PROMPTS, expected, expected_logprobs):
            reply = client.post("/v1/completions", json={
                "prompt": prompt, "max_tokens": TOKENS, "temperature": 0, "ignore_eos": True,
                "logprobs": 2})
            assert reply.status_code == 200, reply.text
            choice = reply.json()["choices"][0]
            assert choice["text"] == tokenizer.decode(tokens)
            # Scored on both ranks (the scratch forwards are mirrored), from gathered logits:
            # fp32, so only the order of the ranks' partial sums differs.
            assert choice["logprobs"]["token_logprobs"] == pytest.approx(logprobs, abs=1e-4)
        (rank1,) = _rank_processes(server.pid)
        everyone = psutil.Process(server.pid).children(recursive=True)
        rank1.kill()
        code = psutil.Process(server.pid).wait(timeout=30)
        assert code != 0
        gone, alive = psutil.wait_procs(everyone, timeout=10)
        assert not alive, alive
    text = log.read_text()
    assert "rank 1 exited" in text
    assert classify(code, text) is FailureClass.CRASH
    with socket.socket() as probe:  # free for the next server (which binds as uvicorn does)
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind(("127.0.0.1", port))
        probe.listen()

