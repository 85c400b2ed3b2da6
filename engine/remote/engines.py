"""A chat engine that is a server somewhere else: OpenAI-compatible (SSE) or Ollama (NDJSON).

vLLM, llama-server, llama-cpp-python's server, LM Studio, Ollama and `candlewick serve` all
speak one of the two dialects. Requests go through
`engine.remote.streaming.StreamingClient`, the same client `candlewick bench --url`
measures servers with.

Figures are measured here, on the client, from the stream: time to first token from sending
the request to the first content chunk, generation speed from the first to the last chunk,
end-to-end latency from sending to the end of the stream. Token counts come from the server's
usage report when it sends one (OpenAI `usage`, Ollama `eval_count`); otherwise the answer's
tokens are counted as chunks received (servers send about one token per chunk) and the prompt
size is unknown. `GenerationStats.measured_on == "client"` and `server_usage` say so.

Failures raise a `RemoteError` subclass with a one-line message naming the connection; the
text that arrived before the failure stays on the exception (`partial`) and on the reply.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from engine.decoding.reply_reader import Part
from engine.decoding.tool_calls import ToolCall
from engine.errors import EngineError
from engine.host.chat_engine import ChatRequest, EngineKind
from engine.host.stats import GenerationStats, StopReason
from engine.remote.streaming import (
    APIS,
    Api,
    ChatStream,
    ClientError,
    RequestError,
    StreamingClient,
    StreamResult,
)

RemoteErrorKind = Literal["connect", "auth", "timeout", "dropped", "http"]

DEFAULT_CONNECT_TIMEOUT_S = 10.0
DEFAULT_TIMEOUT_S = 120.0
# A whole answer may take long on a slow server; only silence is a failure (timeout_s).
MAX_ANSWER_S = 3600.0


@dataclass(frozen=True)
class RemoteEndpoint:
    """Where a remote engine lives and how to talk to it.

    `model`: the model id on the server ("" = the first one the server lists).
    `timeout_s`: the longest the server may stay silent, before the first token (a long
    prompt being processed) and between tokens. `ca_file`: a PEM bundle for servers with a
    private certificate authority; `verify_tls=False` skips the certificate check entirely.
    """

    name: str
    base_url: str
    api: Api = "openai"
    model: str = ""
    api_key: str | None = field(default=None, repr=False)  # never printed
    verify_tls: bool = True
    ca_file: str | None = None
    connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S
    timeout_s: float = DEFAULT_TIMEOUT_S

    def validate(self) -> None:
        """Raise `EngineError` (one line) for settings that cannot work."""
        if not self.name.strip():
            raise EngineError("a connection needs a name")
        if self.api not in APIS:
            raise EngineError(f"unknown API {self.api!r} (choose from {', '.join(APIS)})")
        if self.connect_timeout_s <= 0 or self.timeout_s <= 0:
            raise EngineError("timeouts must be greater than 0 seconds")
        try:
            self.client()
        except ClientError as e:
            raise EngineError(str(e)) from None

    def with_model(self, model: str) -> RemoteEndpoint:
        return dataclasses.replace(self, model=model)

    def client(self) -> StreamingClient:
        return StreamingClient(
            self.base_url,
            api=self.api,
            api_key=self.api_key or None,
            model=self.model or None,
            timeout_s=MAX_ANSWER_S,
            connect_timeout_s=self.connect_timeout_s,
            idle_timeout_s=self.timeout_s,
            verify_tls=self.verify_tls,
            ca_file=self.ca_file or None,
            user_agent="candlewick",
        )


class RemoteError(EngineError):
    """A remote request failed. `str()` is one line for the user; `partial` is the answer text
    that arrived before the failure, `stats` the figures up to it (when a reply had started)."""

    kind: RemoteErrorKind = "http"

    def __init__(
        self,
        message: str,
        *,
        partial: str = "",
        status: int | None = None,
        stats: GenerationStats | None = None,
    ) -> None:
        super().__init__(message)
        self.partial = partial
        self.status = status
        self.stats = stats


class RemoteConnectionError(RemoteError):
    """No connection: refused, unknown host, TLS failure."""

    kind: RemoteErrorKind = "connect"


class RemoteAuthError(RemoteError):
    """HTTP 401/403: the API key is wrong or missing."""

    kind: RemoteErrorKind = "auth"


class RemoteTimeoutError(RemoteError):
    """The server stayed silent longer than the connection's timeout."""

    kind: RemoteErrorKind = "timeout"


class RemoteDroppedError(RemoteError):
    """The server closed the connection before the answer was complete."""

    kind: RemoteErrorKind = "dropped"


class RemoteHTTPError(RemoteError):
    """The server answered with an error (an HTTP status or an error in the stream)."""

    kind: RemoteErrorKind = "http"


@dataclass(frozen=True)
class CheckResult:
    """What testing a connection found."""

    ok: bool
    message: str  # one line: "3 models, answered in 12 ms" or the error
    models: tuple[str, ...] = ()
    latency_s: float | None = None  # the model-list round trip
    error: RemoteError | None = None


def _partial_note(text: str) -> str:
    return f"; the partial answer ({len(text)} characters) is kept" if text else ""


def error_from_result(
    ep: RemoteEndpoint, res: StreamResult, stats: GenerationStats | None = None
) -> RemoteError:
    """The `RemoteError` for a failed stream."""
    where = f"{ep.name} ({ep.base_url})"
    text = res.text
    kw: dict[str, Any] = {"partial": text, "status": res.status, "stats": stats}
    if res.timed_out and res.error_kind == "connect":
        return RemoteTimeoutError(
            f"cannot connect to {where}: no connection within {ep.connect_timeout_s:g} s "
            "(timed out)",
            **kw,
        )
    if res.timed_out:
        what = "no answer" if res.t_first is None and res.status is None else "the answer stalled"
        return RemoteTimeoutError(
            f"{ep.name}: {what}: the server was silent for {ep.timeout_s:g} s "
            f"(timed out){_partial_note(text)}",
            **kw,
        )
    kind = res.error_kind
    err = res.error or "unknown error"
    if kind == "connect":
        return RemoteConnectionError(f"cannot connect to {where}: {err}", **kw)
    if kind == "auth":
        return RemoteAuthError(f"{ep.name}: wrong or missing API key (HTTP {res.status})", **kw)
    if kind == "dropped":
        return RemoteDroppedError(
            f"{ep.name}: the connection dropped mid-answer ({err}){_partial_note(text)}", **kw
        )
    return RemoteHTTPError(f"{ep.name}: {err}{_partial_note(text)}", **kw)


def error_from_request(ep: RemoteEndpoint, e: RequestError) -> RemoteError:
    """The `RemoteError` for a failed model-list request."""
    msg = str(e)
    detail = msg.split(": ", 1)[1] if ": " in msg else msg
    if e.kind == "connect":
        return RemoteConnectionError(
            f"cannot connect to {ep.name} ({ep.base_url}): {detail}", status=e.status
        )
    if e.kind == "auth":
        return RemoteAuthError(
            f"{ep.name}: wrong or missing API key (HTTP {e.status})", status=e.status
        )
    if e.kind == "timeout":
        return RemoteTimeoutError(f"{ep.name}: {detail} (timed out)")
    if e.kind == "dropped":
        return RemoteDroppedError(f"{ep.name}: {detail}", status=e.status)
    return RemoteHTTPError(f"{ep.name}: {detail}", status=e.status)


def client_stats(res: StreamResult, stop_reason: StopReason) -> GenerationStats:
    """Figures for one streamed answer, measured on this side of the network."""
    st = GenerationStats(measured_on="client")
    usage: list[str] = []
    if res.prompt_tokens is not None:
        st.prompt_tokens = res.prompt_tokens
        usage.append("prompt_tokens")
    if res.completion_tokens is not None:
        st.gen_tokens = res.completion_tokens
        usage.append("gen_tokens")
    else:
        st.gen_tokens = res.n_chunks
    st.server_usage = tuple(usage)
    end = res.t_end or time.perf_counter()
    st.total_s = end - res.t_start
    st.ttft_s = (res.t_first - res.t_start) if res.t_first is not None else st.total_s
    times = res.chunk_times
    if st.gen_tokens > 1 and len(times) > 1 and times[-1] > times[0]:
        # Tokens after the first chunk over the time they took to arrive.
        first_chunk_tokens = max(1, round(st.gen_tokens / len(times)))
        st.gen_tps_wall = (st.gen_tokens - first_chunk_tokens) / (times[-1] - times[0])
        st.gen_tps = st.gen_tps_wall
    st.stop_reason = stop_reason
    return st


class RemoteReply:
    """A `ReplyStream` over one streamed request. The server's text is all answer: it is
    asked for no tools, and its thinking (if any) arrives as text."""

    dropped_messages = 0  # the server fits the conversation (or refuses it) itself
    thought: tuple[int, float] | None = None

    def __init__(
        self, endpoint: RemoteEndpoint, stream: ChatStream, cancel: threading.Event | None = None
    ) -> None:
        self.endpoint = endpoint
        self._stream = stream
        self._cancel = cancel
        self._stats: GenerationStats | None = None
        self.tool_calls: list[ToolCall] = []

    @property
    def result(self) -> StreamResult:
        return self._stream.result

    @property
    def prompt_tokens(self) -> int | None:
        return self._stream.result.prompt_tokens

    @property
    def generated_tokens(self) -> int:
        r = self._stream.result
        return r.completion_tokens if r.completion_tokens is not None else r.n_chunks

    @property
    def text(self) -> str:
        return self._stream.result.text

    @property
    def stats(self) -> GenerationStats:
        if self._stats is not None:
            return self._stats
        return client_stats(self._stream.result, "stop")  # a running snapshot

    def parts(self) -> Iterator[list[Part]]:
        for piece in self:
            yield [("content", piece)]

    def __iter__(self) -> Iterator[str]:
        if self._stats is not None:  # iterated to the end already
            return
        yield from self._stream
        res = self._stream.result
        if self._cancel is not None and self._cancel.is_set() and res.finish_reason is None:
            res.cancelled = True  # also when the loop was left by an exception (Ctrl+C)
        if res.cancelled:
            self._stats = client_stats(res, "cancelled")
            return
        if not res.ok:
            self._stats = client_stats(res, "error")
            raise error_from_result(self.endpoint, res, self._stats)
        self._stats = client_stats(res, "length" if res.finish_reason == "length" else "stop")

    def close(self) -> None:
        self._stream.close()


class RemoteEngine:
    """The `ChatEngine` for a server reached over HTTP. Holds nothing but settings: each
    reply is one request on its own connection, so several may run at once."""

    kind: EngineKind = "remote"
    n_ctx: int | None = None  # servers do not say; the server fits or refuses long prompts
    can_continue: bool = False

    def __init__(self, endpoint: RemoteEndpoint) -> None:
        endpoint.validate()
        self.endpoint = endpoint
        self._model = endpoint.model
        self._lock = threading.Lock()

    @property
    def name(self) -> str:
        return f"{self.endpoint.name} · {self._model}" if self._model else self.endpoint.name

    @property
    def model(self) -> str:
        """The model answering: the endpoint's, or the first the server listed."""
        return self._model

    def list_models(self) -> list[str]:
        """Model ids the server offers; raises a `RemoteError`."""
        try:
            return self.endpoint.client().list_models()
        except RequestError as e:
            raise error_from_request(self.endpoint, e) from None

    def check(self) -> CheckResult:
        """Test the connection: can it be reached, is the key accepted, which models are
        there. Never raises for server trouble."""
        t0 = time.perf_counter()
        try:
            models = self.list_models()
        except RemoteError as e:
            return CheckResult(False, str(e), error=e)
        latency = time.perf_counter() - t0
        if not models:
            return CheckResult(
                False, f"{self.endpoint.name}: the server lists no models", latency_s=latency
            )
        note = ""
        if self.endpoint.model and self.endpoint.model not in models:
            note = f"; {self.endpoint.model!r} is not among them"
        n = len(models)
        return CheckResult(
            not note,
            f"{n} model{'s' if n != 1 else ''}, answered in {latency * 1000:.0f} ms{note}",
            tuple(models),
            latency,
        )

    def _resolve_model(self) -> str:
        with self._lock:
            if not self._model:
                models = self.list_models()
                if not models:
                    raise RemoteHTTPError(f"{self.endpoint.name}: the server lists no models")
                self._model = models[0]
            return self._model

    def reply(self, request: ChatRequest, cancel: threading.Event | None = None) -> RemoteReply:
        """Start an answer (the request is sent when iteration starts). The request's
        `policy` is ignored: the server owns its context; so is `thinking`: its text is all
        answer. Tools and continuing an answer are refused."""
        if request.tools:
            raise EngineError("tools need a model loaded on this computer")
        if request.continue_text:
            # The chat APIs have no portable way to say "continue this assistant message".
            raise RemoteHTTPError(
                f"{self.endpoint.name}: continuing a cut-off answer works with a local model "
                "only; ask again or regenerate instead"
            )
        sampling = request.sampling
        sampling.validate()
        client = dataclasses.replace(self.endpoint, model=self._resolve_model()).client()
        msgs: Sequence[Mapping[str, Any]] = [dict(m) for m in request.messages]
        stream = client.stream(
            msgs,
            max_tokens=sampling.max_tokens,
            temperature=sampling.temperature,
            seed=sampling.seed,
            top_p=sampling.top_p,
            stop=sampling.stop,
            cancel=cancel,
        )
        return RemoteReply(self.endpoint, stream, cancel)

    def close(self) -> None:
        """Nothing is held between requests."""
