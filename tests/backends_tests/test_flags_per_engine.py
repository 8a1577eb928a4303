"""What differs per engine beside the flags: the port it listens on by default, the short name
of a configuration (only the knobs it reads), and whether DDTree needs an unreleased build."""

from __future__ import annotations

from backends.flags import default_port
from backends.flags import engine_label
from backends.flags import experimental_note
from backends.flags import is_experimental
from backends.launch_params import LaunchParams

DDTREE = LaunchParams(tp_size=1, speculative_algorithm="ddtree", speculative_ddtree_budget=16)


def test_each_engine_has_its_own_default_port():
    assert (default_port("sglang"), default_port("vllm"), default_port("dflash")) == (
        30000, 8000, 8000)


def test_the_serve_label_names_only_what_serve_reads():
    assert engine_label("dflash", DDTREE) == "ddtree b8 B16 k16 d7 graphs<=32 run48"  # no caps
    plain = LaunchParams(tp_size=1, cuda_graph=False, max_running_requests=8)
    assert engine_label("dflash", plain) == "plain eager run8"
    assert engine_label("sglang", DDTREE) == DDTREE.label()  # layout and memory matter there


def test_ddtree_is_experimental_everywhere_but_in_serve():
    assert experimental_note("dflash", DDTREE) is None and not is_experimental("dflash", DDTREE)
    assert "SGLang" in experimental_note("sglang", DDTREE)
    assert is_experimental("vllm", DDTREE)
    assert experimental_note("sglang", LaunchParams()) is None
