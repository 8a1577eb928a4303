"""An OpenAI request body -> a `Job` for the engine loop, or the reason it is refused.

Everything is checked here, before anything is admitted: a body that is not a JSON object, a
value of the wrong type or out of range (NaN, 1e39, a 65-bit top_k), a parameter this server
does not implement at a value that would change the result (`n: 2`, `echo`, `tools`, ...) is a
`BadRequest` (400) naming the parameter; an unknown `model` is `UnknownModel` (404, as vLLM).
Unknown keys are ignored, as vLLM and the OpenAI API do.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from backends.dflash_server.logprobs import MAX_TOP_LOGPROBS
from dflash_core import SamplingParams

DEFAULT_MAX_TOKENS = 16  # the OpenAI completions default
# Stop strings are matched on the event loop after every round: bounded as the OpenAI API bounds
# them (it takes 4), so a request cannot make that matching cost more than a round.
MAX_STOPS = 16
MAX_STOP_CHARS = 256
# Below this a temperature is greedy in effect, and dividing logits by it overflows float32;
# vLLM and SGLang treat it as greedy too.
GREEDY_BELOW = 1e-5


class BadRequest(ValueError):
    """A request refused with `status` (400; 413 or 408 for a body too large or too slow)."""

    def __init__(self, message: str, param: str | None = None, status: int = 400) -> None:
        super().__init__(message)
        self.param, self.status = param, status


class UnknownModel(LookupError):
    pass


@dataclass(slots=True)
class ServerInfo:
    model_name: str
    tokenizer: Any  # tokenizers.Tokenizer
    eos_token_id: int | None
    max_context: int
    launch: dict[str, Any]  # the launch options, echoed by /v1/models
    vocab_size: int = 0  # 0: unknown (stop_token_ids are then checked only for sign)
    # Names a request's `model` may carry (the served name first); empty: any.
    model_names: tuple[str, ...] = ()
    # A prompt text longer than this cannot fit in max_context tokens, so it is refused before
    # it is tokenised (prompt_char_limit); None: no such check.
    max_prompt_chars: int | None = None


@dataclass(slots=True)
class Job:
    prompt: list[int]
    sampling: SamplingParams
    stream: bool = False
    include_usage: bool = False
    stops: tuple[str, ...] = ()  # stop strings, matched on the decoded text
    top_logprobs: int | None = None  # None: no logprobs


def parse(body: object, info: ServerInfo, chat: bool) -> Job:
    if not isinstance(body, dict):
        raise BadRequest(f"the request body must be a JSON object, got {_json_type(body)}")
    _check_model(body, info)
    _check_unsupported(body)
    stream = _bool(body, "stream", False)
    return Job(_chat_prompt(body, info) if chat else _prompt(body, info),
               _sampling(body, info, chat), stream, _include_usage(body, stream),
               _stops(body), _top_logprobs(body, chat))


def _check_model(body: dict, info: ServerInfo) -> None:
    model = body.get("model")
    if model is None or not info.model_names:
        return
    if model not in info.model_names:
        raise UnknownModel(f"The model `{model}` does not exist (this server serves "
                           f"`{info.model_names[0]}`).")


# --- prompts --------------------------------------------------------------------------------


def _prompt(body: dict, info: ServerInfo) -> list[int]:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, str):
        return _encode(prompt, info, "prompt")
    if isinstance(prompt, list) and prompt and all(type(t) is int for t in prompt):
        return prompt
    raise BadRequest("prompt must be a string or a non-empty list of token ids (one prompt)",
                     "prompt")


def _chat_prompt(body: dict, info: ServerInfo) -> list[int]:
    """The tiny pair has no chat template: roles become plain-text headers."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("messages must be a non-empty list", "messages")
    text = "".join(f"<|{role}|>\n{content}\n"
                   for role, content in (_message(i, m) for i, m in enumerate(messages)))
    return _encode(text + "<|assistant|>\n", info, "messages")


def _encode(text: str, info: ServerInfo, param: str) -> list[int]:
    if info.max_prompt_chars is not None and len(text) > info.max_prompt_chars:
        raise BadRequest(f"the {param} is {len(text)} characters: more than max_context "
                         f"({info.max_context}) tokens can hold", param)
    return info.tokenizer.encode(_text(text, param)).ids


def _text(text: str, param: str) -> str:
    """`text`, or a BadRequest if it holds a lone surrogate (valid JSON, not Unicode text)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise BadRequest(f"{param} holds a lone surrogate (an unpaired \\ud800-\\udfff escape); "
                         "it is not valid Unicode text", param) from None
    return text


def prompt_char_limit(tokenizer, max_context: int) -> int:
    """Characters past which a prompt surely has more than max_context tokens: every token
    covers at most its longest vocabulary entry, and a normaliser may shrink the text up to
    fourfold (compositions) before it is split."""
    longest = max(map(len, tokenizer.get_vocab(with_added_tokens=True)), default=1)
    return max_context * longest * 4


def _message(i: int, message: object) -> tuple[str, str]:
    param = f"messages[{i}]"
    if not isinstance(message, dict):
        raise BadRequest(f"{param} must be an object with a role and a content", param)
    role, content = message.get("role"), message.get("content")
    if not isinstance(role, str) or not role:
        raise BadRequest(f"{param} needs a role (a string)", f"{param}.role")
    if content is None:
        return role, ""
    if isinstance(content, str):
        return role, content
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text"
                                         and isinstance(p.get("text"), str) for p in content):
        return role, "".join(p["text"] for p in content)
    raise BadRequest(f"{param}.content must be a string or a list of text parts (other "
                     "content types are not supported)", f"{param}.content")


# --- sampling -------------------------------------------------------------------------------


def _sampling(body: dict, info: ServerInfo, chat: bool) -> SamplingParams:
    names = ("max_completion_tokens", "max_tokens") if chat else ("max_tokens",)
    name = next((n for n in names if body.get(n) is not None), names[-1])
    max_tokens = _int(body, name, DEFAULT_MAX_TOKENS, 1)
    temperature = _number(body, "temperature", 1.0, 0.0)
    stops = tuple(_stop_ids(body, info))
    if info.eos_token_id is not None and not _bool(body, "ignore_eos", False):
        stops += (info.eos_token_id,)
    top_k = _int(body, "top_k", 0, -1)  # -1: off, as in vLLM and SGLang
    try:
        return SamplingParams(temperature=0.0 if temperature < GREEDY_BELOW else temperature,
                              top_k=max(top_k, 0), top_p=_top_p(body),
                              max_tokens=max_tokens, stop_token_ids=stops)
    except ValueError as error:  # what the engine's tensors cannot hold (1e39, 2**64, ...)
        raise BadRequest(str(error), str(error).split()[0]) from None


def _top_p(body: dict) -> float:
    """In (0, 1], the engine's range: 0 would keep no token."""
    value = body.get("top_p")
    if value is None:
        return 1.0
    if type(value) not in (int, float) or not 0 < _float(value) <= 1:
        raise BadRequest(f"top_p must be a finite number in (0, 1], got {value!r:.40}", "top_p")
    return float(value)


def _stop_ids(body: dict, info: ServerInfo) -> list[int]:
    ids = body.get("stop_token_ids")
    if ids is None:
        return []
    top = info.vocab_size - 1 if info.vocab_size else None
    if not isinstance(ids, list) or not all(type(t) is int and 0 <= t and (top is None or t <= top)
                                            for t in ids):
        raise BadRequest(f"stop_token_ids must be a list of token ids in 0..{top or 'vocab'}",
                         "stop_token_ids")
    return ids


def _stops(body: dict) -> tuple[str, ...]:
    stop = body.get("stop")
    stops = [stop] if isinstance(stop, str) else stop if stop is not None else []
    if not isinstance(stops, list) or len(stops) > MAX_STOPS or not all(
            isinstance(s, str) and 0 < len(s) <= MAX_STOP_CHARS for s in stops):
        raise BadRequest(f"stop must be a string or a list of at most {MAX_STOPS} strings, each "
                         f"1..{MAX_STOP_CHARS} characters (token ids go in stop_token_ids)",
                         "stop")
    return tuple(_text(s, "stop") for s in stops)


def _top_logprobs(body: dict, chat: bool) -> int | None:
    """Completions: `logprobs: k`. Chat: `logprobs: true` with `top_logprobs: k` (default 0)."""
    if not chat:
        value = body.get("logprobs")
        return None if value is None else _int(body, "logprobs", 0, 0, MAX_TOP_LOGPROBS)
    wanted = _bool(body, "logprobs", False)
    top = body.get("top_logprobs")
    if top is not None and not wanted:
        raise BadRequest("top_logprobs needs logprobs: true", "top_logprobs")
    return _int(body, "top_logprobs", 0, 0, MAX_TOP_LOGPROBS) if wanted else None


def _include_usage(body: dict, stream: bool) -> bool:
    options = body.get("stream_options")
    if options is None:
        return False
    if not isinstance(options, dict):
        raise BadRequest(f"stream_options must be an object, got {_json_type(options)}",
                         "stream_options")
    if not stream:
        raise BadRequest("stream_options is only allowed with stream: true", "stream_options")
    return _bool(options, "include_usage", False, "stream_options.include_usage")


# --- what this server does not do -----------------------------------------------------------


def _none_or(*accepted: object) -> Callable[[object], bool]:
    """Accepts null or one of `accepted` (same type: `true` is not `1`)."""
    return lambda v: v is None or any(type(v) is type(a) and v == a for a in accepted)


def _empty(value: object) -> bool:
    return value is None or value in ([], {}, "")


def _zero(value: object) -> bool:
    return value is None or type(value) in (int, float) and value == 0


# Parameter -> whether its value is the no-op one we can honour. Anything else is refused, so a
# client never gets silently different semantics than it asked for.
UNSUPPORTED: dict[str, Callable[[object], bool]] = {
    "n": _none_or(1), "best_of": _none_or(1), "echo": _none_or(False), "suffix": _none_or(""),
    "use_beam_search": _none_or(False), "prompt_logprobs": _none_or(),
    "logit_bias": _empty, "tools": _empty, "functions": _empty,
    "tool_choice": _none_or("none", "auto"), "function_call": _none_or("none", "auto"),
    "response_format": lambda v: v is None or v == {"type": "text"},
    "presence_penalty": _zero, "frequency_penalty": _zero, "min_tokens": _zero,
    "repetition_penalty": lambda v: v is None or type(v) in (int, float) and v == 1,
    "guided_json": _empty, "guided_regex": _empty, "guided_choice": _empty,
    "guided_grammar": _empty, "min_p": _zero,
}


def _check_unsupported(body: dict) -> None:
    for name, honoured in UNSUPPORTED.items():
        if name in body and not honoured(body[name]):
            raise BadRequest(f"{name}={body[name]!r:.60} is not supported by this server",
                             name)
    temperature = body.get("temperature")
    if body.get("seed") is not None and not _zero(temperature if temperature is not None
                                                  else 1.0):
        raise BadRequest("seed is not supported when sampling (one generator serves every "
                         "request); it is accepted, and moot, with temperature 0", "seed")


# --- typed fields ---------------------------------------------------------------------------


def _int(body: dict, name: str, default: int, low: int, high: int | None = None) -> int:
    value = body.get(name)
    if value is None:
        return default
    if type(value) is not int or value < low or (high is not None and value > high):
        span = f"{low}..{high}" if high is not None else f">= {low}"
        raise BadRequest(f"{name} must be an integer {span}, got {value!r:.40}", name)
    return value


def _number(body: dict, name: str, default: float, low: float,
            high: float = math.inf) -> float:
    value = body.get(name)
    if value is None:
        return default
    if type(value) not in (int, float) or not math.isfinite(_float(value)) or \
            not low <= value <= high:
        span = f"in [{low:g}, {high:g}]" if math.isfinite(high) else f">= {low:g}"
        raise BadRequest(f"{name} must be a finite number {span}, got {value!r:.40}", name)
    return float(value)


def _float(value: float) -> float:
    try:
        return float(value)
    except OverflowError:  # an integer literal past float range
        return math.inf


def _bool(body: dict, name: str, default: bool, param: str | None = None) -> bool:
    value = body.get(name)
    if value is None:
        return default
    if type(value) is not bool:
        raise BadRequest(f"{param or name} must be true or false, got {value!r:.40}",
                         param or name)
    return value


def _json_type(value: object) -> str:
    names = {dict: "an object", list: "an array", str: "a string", bool: "a boolean",
             int: "a number", float: "a number", type(None): "null"}
    return names.get(type(value), type(value).__name__)
