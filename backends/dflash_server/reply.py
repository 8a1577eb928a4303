"""One response as it is built: token ids -> text deltas (stop strings cut, never half sent),
their logprobs, and the OpenAI objects (completions and chat, streamed or whole)."""

from __future__ import annotations

import itertools
import time
import uuid

from backends.dflash_server.logprobs import TokenLogprobs
from backends.dflash_server.loop import Event
from backends.dflash_server.protocol import Job, ServerInfo

FINISH = {"stop": "stop", "max_tokens": "length", "length": "length"}


class Reply:
    def __init__(self, info: ServerInfo, chat: bool, job: Job) -> None:
        self.info, self.chat, self.job = info, chat, job
        self.id = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex[:24]}"
        self.created = int(time.time())
        self.tokens: list[int] = []  # kept: up to the one that completes a stop string
        self.logprobs: list[TokenLogprobs] = []
        self.text = ""  # sent (streaming) or final
        self.finish: str | None = None  # the engine's reason, "stop" for a stop string, "error"
        self.error: str | None = None
        self._offset = 0  # text_offset of the next token (completions logprobs)

    def add(self, event: Event) -> tuple[str, list[TokenLogprobs]]:
        """Take one engine event -> (new text, logprobs of the tokens kept from it)."""
        if event.error:
            self.finish, self.error = "error", event.error
            return "", []
        kept, full, stopped = self._keep(event.tokens)
        self.finish = "stop" if stopped else event.finish
        logprobs = (event.logprobs or [])[:kept]
        self.logprobs += logprobs
        visible = full if self.finish else self._settled(full)
        new = visible[len(self.text):] if len(visible) > len(self.text) else ""
        self.text += new
        return new, logprobs

    def _keep(self, tokens: list[int]) -> tuple[int, str, bool]:
        """Append tokens up to the first stop string -> (how many were kept, the decoded text
        cut before the stop string, whether one was found)."""
        decode = self.info.tokenizer.decode
        full = decode(self.tokens + tokens)
        if self._stop_cut(full) is None:  # the usual case: one decode for the whole event
            self.tokens += tokens
            return len(tokens), full, False
        for kept, token in enumerate(tokens, 1):  # token by token: the stop ends the reply
            self.tokens.append(token)
            full = decode(self.tokens)
            cut = self._stop_cut(full)
            if cut is not None:
                return kept, full[:cut], True
        return len(tokens), full, False

    def _stop_cut(self, full: str) -> int | None:
        """Where the first stop string starts in `full`, if one does. Nothing sent can hold a
        stop's start (see _settled), so only the unsent tail is searched: the new text and at
        most the longest stop's length before it."""
        cuts = [c for c in (full.find(s, len(self.text)) for s in self.job.stops) if c >= 0]
        return min(cuts) if cuts else None

    def _settled(self, full: str) -> str:
        """The part of `full` that can be sent while more tokens may follow: not a character
        split across tokens, nor a tail that a stop string might start with."""
        if full.endswith("\ufffd"):
            return self.text
        for n in range(min(len(full), max(map(len, self.job.stops), default=1) - 1), 0, -1):
            if any(stop.startswith(full[-n:]) for stop in self.job.stops):
                return full[:-n]
        return full

    # --- OpenAI objects -------------------------------------------------------------------------

    def chunk(self, text: str, logprobs: list[TokenLogprobs]) -> dict:
        if self.chat:
            choice = {"index": 0, "delta": {"role": "assistant", "content": text}}
        else:
            choice = {"index": 0, "text": text}
        choice["logprobs"] = self._logprobs(logprobs)
        choice["finish_reason"] = FINISH.get(self.finish) if self.finish else None
        return {"id": self.id, "object": "chat.completion.chunk" if self.chat
                else "text_completion", "created": self.created, "model": self.info.model_name,
                "choices": [choice]}

    def usage(self) -> dict:
        prompt = len(self.job.prompt)
        return {"prompt_tokens": prompt, "completion_tokens": len(self.tokens),
                "total_tokens": prompt + len(self.tokens)}

    def usage_chunk(self) -> dict:
        return {**self.chunk("", []), "choices": [], "usage": self.usage()}

    def whole(self) -> dict:
        if self.chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": self.text}}
        else:
            choice = {"index": 0, "text": self.text}
        choice["logprobs"] = self._logprobs(self.logprobs)
        choice["finish_reason"] = FINISH.get(self.finish)
        return {"id": self.id, "object": "chat.completion" if self.chat else "text_completion",
                "created": self.created, "model": self.info.model_name, "choices": [choice],
                "usage": self.usage()}

    def _logprobs(self, entries: list[TokenLogprobs]) -> dict | None:
        if self.job.top_logprobs is None:
            return None
        return self._chat_logprobs(entries) if self.chat else self._completion_logprobs(entries)

    def _completion_logprobs(self, entries: list[TokenLogprobs]) -> dict:
        tokens = [self._token(e.token) for e in entries]
        starts = list(itertools.accumulate((len(t) for t in tokens), initial=self._offset))
        self._offset = starts.pop()
        return {"tokens": tokens, "token_logprobs": [e.logprob for e in entries],
                "top_logprobs": [{self._token(i): lp for i, lp in e.top} for e in entries],
                "text_offset": starts}

    def _chat_logprobs(self, entries: list[TokenLogprobs]) -> dict:
        def item(token: int, logprob: float) -> dict:
            text = self._token(token)
            return {"token": text, "logprob": logprob, "bytes": list(text.encode())}
        return {"content": [{**item(e.token, e.logprob),
                             "top_logprobs": [item(i, lp) for i, lp in e.top]}
                            for e in entries]}

    def _token(self, token: int) -> str:
        return self.info.tokenizer.decode([token], skip_special_tokens=False)


def error_body(message: str, status: int, kind: str = "invalid_request_error",
               param: str | None = None) -> dict:
    return {"error": {"message": message, "type": kind, "param": param, "code": status}}
