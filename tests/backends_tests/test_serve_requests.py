"""What `dflash-tune serve` accepts and what it refuses (Starlette TestClient over the real app,
engine thread and shipped pair): every bad request is a 400 (404 for an unknown model) with
its reason, admitted nothing, and the OpenAI parameters it does take (stop, logprobs) work."""

from __future__ import annotations

import json
import math

import pytest
from starlette.testclient import TestClient

from backends.dflash_server.app import build_app
from backends.dflash_server.launch import ServeOptions, build
from backends.launch_cli import engine_params
from dflash_core import SamplingParams
from dflash_core.training.evaluate import held_out_prompts
from dflash_core.training.pair import ensure_pair

PAIR = ensure_pair()
PROMPT = held_out_prompts(PAIR)[0][:24]


@pytest.fixture(scope="module")
def served():
    loop, info = build(ServeOptions(
        PAIR / "target", PAIR / "drafter",
        engine_params(PAIR / "drafter", max_running_requests=2), max_context=256))
    loop.start()
    with TestClient(build_app(loop, info)) as client:
        yield client, loop, info
    loop.stop()


def _greedy(**extra) -> dict:
    return {"prompt": PROMPT, "max_tokens": 12, "temperature": 0, "ignore_eos": True, **extra}


def _refused(client, body, status=400, path="/v1/completions", raw=None) -> dict:
    reply = client.post(path, content=raw) if raw is not None else client.post(path, json=body)
    assert reply.status_code == status, reply.text
    return reply.json()["error"]


@pytest.mark.parametrize("raw, reason", [
    ("[1, 2]", "must be a JSON object, got an array"),
    ('"abc"', "must be a JSON object, got a string"),
    ("null", "must be a JSON object, got null"),
    ("{", "not valid JSON"),
    ("[" * 100_000, "not valid JSON"),
])
def test_a_body_that_is_not_a_json_object_is_a_400_with_the_reason(served, raw, reason):
    client, loop, _ = served
    before = loop.counters.requests
    assert reason in _refused(client, None, raw=raw)["message"]
    assert loop.counters.requests == before  # nothing admitted


@pytest.mark.parametrize("messages, param", [
    ([{"content": "hi"}], "messages[0].role"),
    ([{"role": 3, "content": "hi"}], "messages[0].role"),
    (["hi"], "messages[0]"),
    ([{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}],
     "messages[0].content"),
])
def test_a_chat_message_without_a_role_or_with_odd_content_is_a_400(served, messages, param):
    client, *_ = served
    error = _refused(client, {"messages": messages}, path="/v1/chat/completions")
    assert error["param"] == param


def test_chat_content_given_as_text_parts_is_read(served):
    client, *_ = served
    parts = [{"type": "text", "text": "def f"}, {"type": "text", "text": "():"}]
    plain = client.post("/v1/chat/completions", json={
        "messages": [{"role": "user", "content": "def f():"}], "max_tokens": 5,
        "temperature": 0}).json()
    split = client.post("/v1/chat/completions", json={
        "messages": [{"role": "user", "content": parts}], "max_tokens": 5,
        "temperature": 0}).json()
    assert split["usage"] == plain["usage"]  # the same prompt, not the list's repr
    assert split["choices"][0]["message"] == plain["choices"][0]["message"]


@pytest.mark.parametrize("field, value, reason", [
    ("max_tokens", 0, "max_tokens must be an integer >= 1"),
    ("max_tokens", -3, "max_tokens must be an integer >= 1"),
    ("max_tokens", 4.5, "max_tokens must be an integer"),
    ("max_tokens", True, "max_tokens must be an integer"),
    ("temperature", "hot", "temperature must be a finite number"),
    ("temperature", -1, "temperature must be a finite number >= 0"),
    ("temperature", 1e39, "held as float32"),
    ("temperature", 10**400, "temperature must be a finite number"),
    ("top_k", 2**64, "int64"),
    ("top_k", -2, "top_k must be an integer >= -1"),
    ("top_p", 0, "top_p must be a finite number in (0, 1]"),
    ("top_p", 1.5, "top_p must be a finite number in (0, 1]"),
    ("stop", 7, "stop must be a string or a list"),
    ("stop", [""], "each 1..256 characters"),
    ("stop", ["x"] * 17, "at most 16 strings"),
    ("stop", ["x" * 257], "each 1..256 characters"),
    ("stop_token_ids", [1, 10**6], "stop_token_ids must be a list of token ids in 0..2047"),
    ("stream", "yes", "stream must be true or false"),
    ("stream_options", "x", "stream_options must be an object"),
    ("logprobs", 21, "logprobs must be an integer 0..20"),
    ("logprobs", True, "logprobs must be an integer"),
])
def test_a_value_out_of_type_or_range_is_a_400_naming_it(served, field, value, reason):
    client, *_ = served
    error = _refused(client, _greedy(**{field: value}))
    assert reason in error["message"] and error["param"] == field


@pytest.mark.parametrize("field, value", [
    ("prompt", "a\ud800b"), ("stop", ["\ud800"]),
    ("messages", [{"role": "user", "content": "\udfff"}])])
def test_a_lone_surrogate_is_a_400_json_error(served, field, value):
    client, *_ = served
    body = {**_greedy(), field: value}
    path = "/v1/chat/completions" if field == "messages" else "/v1/completions"
    error = _refused(client, None, path=path, raw=json.dumps(body))  # ascii: valid JSON
    assert "lone surrogate" in error["message"] and error["param"] == field


def test_a_prompt_too_long_in_characters_is_refused_before_it_is_tokenised(served):
    client, _, info = served
    error = _refused(client, _greedy(prompt="x" * (info.max_prompt_chars + 1)))
    assert "characters: more than max_context (256) tokens can hold" in error["message"]


@pytest.mark.parametrize("literal", ["NaN", "Infinity", "-Infinity"])
def test_temperature_nan_or_infinite_is_a_400(served, literal):
    client, *_ = served
    raw = json.dumps(_greedy()).replace('"temperature": 0', f'"temperature": {literal}')
    error = _refused(client, None, raw=raw)
    assert "temperature must be a finite number" in error["message"]


def test_stream_options_that_is_not_an_object_admits_nothing(served):
    client, loop, _ = served
    before = (loop.counters.requests, loop.counters.generated_tokens)
    _refused(client, _greedy(stream=True, stream_options="x", max_tokens=200))
    assert (loop.counters.requests, loop.counters.generated_tokens) == before
    assert loop.counters.running == 0


@pytest.mark.parametrize("field, value", [
    ("n", 2), ("best_of", 3), ("echo", True), ("suffix", "x"), ("logit_bias", {"5": 10}),
    ("presence_penalty", 0.5), ("frequency_penalty", 1),
    ("response_format", {"type": "json_object"}), ("seed", 3),
])
def test_an_unsupported_parameter_is_a_400_saying_so(served, field, value):
    client, *_ = served
    error = _refused(client, _greedy(**{field: value, "temperature": 0.7}))
    assert "not supported" in error["message"] and error["param"] == field


def test_chat_tools_are_a_400_saying_so(served):
    client, *_ = served
    error = _refused(client, {"messages": [{"role": "user", "content": "x"}],
                              "tools": [{"type": "function"}]}, path="/v1/chat/completions")
    assert "not supported" in error["message"] and error["param"] == "tools"


def test_the_no_op_values_of_unsupported_parameters_are_accepted(served):
    """What benchmark clients send by default (vLLM's sends best_of 1, logprobs null)."""
    client, *_ = served
    reply = client.post("/v1/completions", json=_greedy(
        n=1, best_of=1, echo=False, logprobs=None, presence_penalty=0, frequency_penalty=0.0,
        logit_bias={}, seed=1, user="me", stream_options=None))
    assert reply.status_code == 200, reply.text


def test_an_unknown_model_is_a_404_and_the_served_names_are_accepted(served):
    client, _, info = served
    error = _refused(client, _greedy(model="gpt-4"), status=404)
    assert "gpt-4" in error["message"] and error["type"] == "NotFoundError"
    for name in (info.model_name, str(PAIR / "target"), None):
        assert client.post("/v1/completions", json=_greedy(model=name)).status_code == 200


# --- stop -------------------------------------------------------------------------------------


def _text(client, **extra) -> dict:
    reply = client.post("/v1/completions", json=_greedy(**extra))
    assert reply.status_code == 200, reply.text
    return reply.json()


def _streamed_text(client, **extra) -> tuple[str, str | None]:
    with client.stream("POST", "/v1/completions", json=_greedy(stream=True, **extra)) as reply:
        chunks = [json.loads(line[6:]) for line in reply.iter_lines()
                  if line.startswith("data: ") and line != "data: [DONE]"]
    text = "".join(c["choices"][0]["text"] for c in chunks)
    return text, chunks[-1]["choices"][0]["finish_reason"]


def test_a_stop_string_ends_the_text_before_it_with_finish_stop(served):
    client, *_ = served
    whole = _text(client, max_tokens=40)["choices"][0]["text"]
    stop = whole[len(whole) // 2: len(whole) // 2 + 3]  # a string inside the greedy text
    cut = whole[: whole.index(stop)]
    reply = _text(client, max_tokens=40, stop=[stop, "never appears"])
    assert reply["choices"][0]["text"] == cut
    assert reply["choices"][0]["finish_reason"] == "stop"
    assert reply["usage"]["completion_tokens"] < 40
    assert _streamed_text(client, max_tokens=40, stop=stop) == (cut, "stop")


def test_a_stop_string_that_never_appears_changes_nothing(served):
    client, *_ = served
    plain = _text(client, max_tokens=30)
    assert _text(client, max_tokens=30, stop="\u2603\u2603")["choices"] == plain["choices"]
    assert _streamed_text(client, max_tokens=30, stop="\u2603\u2603") == (
        plain["choices"][0]["text"], "length")


def test_a_stop_token_id_ends_the_reply(served):
    client, loop, _ = served
    tokens = loop.engine.generate([PROMPT], SamplingParams(max_tokens=12), loop.spec).tokens[0]
    reply = _text(client, stop_token_ids=[tokens[5]])
    assert reply["usage"]["completion_tokens"] == tokens.index(tokens[5]) + 1
    assert reply["choices"][0]["finish_reason"] == "stop"


# --- logprobs ---------------------------------------------------------------------------------


def test_completion_logprobs_are_the_targets_top_k_for_each_token(served):
    client, *_ = served
    reply = _text(client, logprobs=3)
    choice, n = reply["choices"][0], reply["usage"]["completion_tokens"]
    logprobs = choice["logprobs"]
    assert len(logprobs["tokens"]) == len(logprobs["token_logprobs"]) == n
    assert "".join(logprobs["tokens"]) == choice["text"]
    assert logprobs["text_offset"][0] == 0
    for token, logprob, top in zip(logprobs["tokens"], logprobs["token_logprobs"],
                                   logprobs["top_logprobs"]):
        assert len(top) == 3 and logprob <= 0
        # Greedy: the token is the target's most likely one, and its logprob the top one.
        best = max(top, key=top.get)
        assert best == token and math.isclose(top[best], logprob, abs_tol=1e-4)
    assert _text(client)["choices"][0]["logprobs"] is None  # not asked: not computed


def test_logprobs_after_temperature_are_flatter_than_greedy_ones(served):
    client, *_ = served
    cold = _text(client, logprobs=2, max_tokens=1)["choices"][0]["logprobs"]
    hot = _text(client, logprobs=2, max_tokens=1, temperature=4.0)["choices"][0]["logprobs"]
    assert max(hot["top_logprobs"][0].values()) < max(cold["top_logprobs"][0].values())


def test_streamed_logprobs_match_the_whole_reply(served):
    client, *_ = served
    whole = _text(client, logprobs=2)["choices"][0]["logprobs"]
    with client.stream("POST", "/v1/completions", json=_greedy(stream=True, logprobs=2)) as r:
        chunks = [json.loads(line[6:]) for line in r.iter_lines()
                  if line.startswith("data: ") and line != "data: [DONE]"]
    streamed = [lp for c in chunks for lp in c["choices"][0]["logprobs"]["token_logprobs"]]
    assert streamed == pytest.approx(whole["token_logprobs"], abs=1e-5)


def test_chat_logprobs_take_logprobs_true_and_top_logprobs(served):
    client, *_ = served
    body = {"messages": [{"role": "user", "content": "def f():"}], "max_tokens": 6,
            "temperature": 0, "ignore_eos": True, "logprobs": True, "top_logprobs": 2}
    reply = client.post("/v1/chat/completions", json=body).json()
    content = reply["choices"][0]["logprobs"]["content"]
    assert len(content) == reply["usage"]["completion_tokens"] == 6
    assert all(len(c["top_logprobs"]) == 2 and c["top_logprobs"][0]["token"] == c["token"]
               for c in content)
    assert content[0]["bytes"] == list(content[0]["token"].encode())
    error = _refused(client, {**body, "logprobs": False}, path="/v1/chat/completions")
    assert error["param"] == "top_logprobs"


# --- the engine's own guard -------------------------------------------------------------------


@pytest.mark.parametrize("field, value, message", [
    ("temperature", 1e39, "held as float32"),
    ("temperature", 1e-40, "held as float32"),
    ("top_k", 2**64, r"top_k must be at most 9223372036854775807 \(int64\)"),
    ("top_p", 1e-50, "below float32's smallest normal"),
    ("max_tokens", True, "max_tokens must be an integer"),
    ("temperature", "1", "temperature must be a number"),
    ("stop_token_ids", 5, "stop_token_ids must be a sequence"),
    ("stop_token_ids", (-1,), "stop_token_ids must be >= 0"),
])
def test_sampling_params_refuse_what_the_engine_tensors_cannot_hold(field, value, message):
    with pytest.raises(ValueError, match=message):
        SamplingParams(**{field: value})


def test_sampling_params_normalise_scalars_and_stop_ids():
    import numpy as np

    params = SamplingParams(temperature=np.float32(0.5), top_k=np.int64(3), stop_token_ids=[1])
    assert (type(params.temperature), type(params.top_k)) == (float, int)
    assert params.stop_token_ids == (1,)
