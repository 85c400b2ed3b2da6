"""What one request reports when it ends: the one finish-reason type and the one stats type.

Every client of the host reads these: the chat's performance panel, the HTTP API's usage and
timings, the benchmark, `candlewick run`. A remote engine (engine.remote) fills the same type
from what it measures on arrival (`measured_on="client"`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Literal

# stop: end of generation; length: max tokens; stop_string: a stop string appeared;
# context_full: the sequence's context is full; cancelled: the client stopped it; timeout: its
# deadline passed; error: a decode failed (or a remote stream broke part-way; the partial text
# is kept).
StopReason = Literal[
    "stop", "length", "stop_string", "context_full", "cancelled", "timeout", "error"
]
MeasuredOn = Literal["engine", "client"]


@dataclass
class GenerationStats:
    prompt_tokens: int = 0
    cached_tokens: int = 0  # prompt tokens reused from the KV cache, not processed again
    queue_s: float = 0.0  # submitted -> given a slot
    ttft_s: float = 0.0  # wall clock, submitted -> first text piece (total_s if none)
    prompt_tps: float = 0.0  # prompt tokens decoded / time in the decodes that read them
    gen_tokens: int = 0
    gen_tps: float = 0.0  # generated tokens / time in the decodes that produced them
    gen_tps_wall: float = 0.0  # wall clock between first and last token
    total_s: float = 0.0
    stop_reason: StopReason = "stop"
    error: str | None = None  # stop_reason "error": what went wrong, one line
    # Time in the decodes that carried this request's tokens (a step shared with other
    # requests counts whole: the speed this request saw) and how many of its tokens they held.
    prompt_eval_ms: float = 0.0
    eval_ms: float = 0.0
    n_prompt_eval: int = 0
    n_eval: int = 0
    # Speculative decoding: tokens proposed by the drafter and how many the model accepted.
    draft_tokens: int = 0
    draft_accepted: int = 0
    # What drafting measured on this model and machine when the request ended: tokens per
    # second of drafting requests' steps over plain steps', at its concurrency level
    # (engine.host.draft_gain; None: not drafting, or not measured yet).
    draft_gain: float | None = None
    # Images and audio: their rows in the prompt, how many chunks the projector encoded
    # for this request (0 when their KV cells were reused) and the time that took.
    media_tokens: int = 0
    media_encoded: int = 0
    media_encode_ms: float = 0.0
    # Reasoning models: the tokens and wall-clock time spent inside the thinking block (set by
    # whoever separates it from the answer: the server's routes, the desktop chat).
    thinking_tokens: int = 0
    thinking_s: float = 0.0
    # Where the figures were measured: "engine" (in this process, around llama.cpp's decode
    # calls) or "client" (a remote server's stream, timed on arrival; prompt_tps and eval
    # figures are then 0 and gen_tps is the wall-clock rate between first and last chunk).
    measured_on: MeasuredOn = "engine"
    # Client-measured stats: the counts taken from the server's usage report rather than
    # counted here ("prompt_tokens", "gen_tokens"). A count not named is the number of chunks
    # received (gen_tokens) or unknown, left 0 (prompt_tokens).
    server_usage: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def finalize_rates(self) -> None:
        """Derive the rates from the counts and times."""
        if self.n_prompt_eval and self.prompt_eval_ms > 0:
            self.prompt_tps = self.n_prompt_eval / (self.prompt_eval_ms / 1000)
        if self.draft_tokens and self.eval_ms > 0:
            # Speculative steps decode rejected drafts too: count the tokens that came out.
            self.gen_tps = self.gen_tokens / (self.eval_ms / 1000)
        elif self.n_eval and self.eval_ms > 0:
            self.gen_tps = self.n_eval / (self.eval_ms / 1000)


__all__ = ["GenerationStats", "MeasuredOn", "StopReason"]
