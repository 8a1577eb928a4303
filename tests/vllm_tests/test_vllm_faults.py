"""Real vLLM failures, classified from its own output, each leaving no process behind."""

from __future__ import annotations

import socket
import threading
import time

import psutil
import pytest
from vllm_helpers import deployment, server_processes

from backends.contract import FailureClass, LaunchFailed, Workload
from backends.launch_params import LaunchParams
from backends.serving import VLLMBackend

pytestmark = pytest.mark.vllm

PLAIN = LaunchParams(tp_size=1, cuda_graph=False, max_running_requests=4)
WORKLOAD = Workload(input_len=16, output_len=4, concurrency=(1,))


def _launch_failure(backend: VLLMBackend, during=None) -> LaunchFailed:
    """Launch PLAIN and return how it failed; ``during(stop)`` runs beside the start-up."""
    stop = threading.Event()
    side = during and threading.Thread(target=during, args=(stop,), daemon=True)
    if side:
        side.start()
    try:
        with pytest.raises(LaunchFailed) as failed, backend.session(PLAIN, WORKLOAD):
            pass
    finally:
        stop.set()
        if side:
            side.join(timeout=60)
    assert server_processes() == []  # no API server, EngineCore or Worker left
    return failed.value


def test_an_unknown_flag_is_an_invalid_config(vllm_python):
    backend = VLLMBackend(deployment(vllm_python, speculative=False,
                                     extra_args=("--no-such-flag", "3")), start_timeout_s=300)
    failure = _launch_failure(backend)
    assert failure.failure is FailureClass.INVALID_CONFIG
    assert "--no-such-flag" in failure.log_excerpt


def test_a_kv_cache_too_small_for_the_context_is_an_oom(vllm_python):
    # 1 MiB holds a few hundred tokens of the tiny target; --max-model-len asks for 4096.
    backend = VLLMBackend(deployment(vllm_python, speculative=False, context_length=4096,
                                     kv_cache_bytes=2**20), start_timeout_s=600)
    failure = _launch_failure(backend)
    assert failure.failure is FailureClass.OOM, failure.log_excerpt


def test_a_port_taken_while_vllm_starts_is_port_in_use(vllm_python):
    """The port is free when the launch checks it and taken before vLLM binds it (its imports
    take seconds), so the class comes from vLLM's own error."""
    backend = VLLMBackend(deployment(vllm_python, speculative=False), start_timeout_s=300)
    holder = socket.socket()

    def take_port(stop: threading.Event) -> None:
        port = _listening_port_of_new_vllm(stop)
        if port:
            holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            holder.bind(("127.0.0.1", port))
            holder.listen()

    try:
        failure = _launch_failure(backend, during=take_port)
    finally:
        holder.close()
    assert failure.failure is FailureClass.PORT_IN_USE, failure.log_excerpt
    assert "Address already in use" in failure.log_excerpt


def test_an_engine_core_killed_mid_load_is_a_crash(vllm_python):
    backend = VLLMBackend(deployment(vllm_python), start_timeout_s=600)

    def kill_engine_core(stop: threading.Event) -> None:
        while not stop.is_set():
            for proc in server_processes():
                if _is_engine_core(proc):
                    proc.kill()
                    return
            time.sleep(0.2)

    failure = _launch_failure(backend, during=kill_engine_core)
    assert failure.failure is FailureClass.CRASH, failure.log_excerpt


def _listening_port_of_new_vllm(stop: threading.Event) -> int | None:
    """The --port of the API server our launch just started, read from its command line."""
    while not stop.is_set():
        for proc in server_processes():
            argv = _cmdline(proc)
            if "--port" in argv:
                return int(argv[argv.index("--port") + 1])
        time.sleep(0.02)
    return None


def _is_engine_core(proc: psutil.Process) -> bool:
    """The API server's spawned child (titled VLLM::EngineCore only once it is up); its other
    child is multiprocessing's resource tracker."""
    argv = " ".join(_cmdline(proc))
    if "EngineCore" in argv:
        return True
    try:
        parent = proc.parent()
    except psutil.NoSuchProcess:
        return False
    return "spawn_main" in argv and parent is not None and "api_server" in " ".join(
        _cmdline(parent))


def _cmdline(proc: psutil.Process) -> list[str]:
    try:
        return proc.cmdline()
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return []
