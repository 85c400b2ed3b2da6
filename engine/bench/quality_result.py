"""The result of `candlewick bench quality`: a reference and its candidates on one text.

Typed with pydantic: `QualityResult.save` writes the JSON (schema `candlewick-quality/1`),
`QualityResult.load` reads it back and checks every field, so a window that shows the table
and `bench compare` read the same figures. Probabilities, agreements and Δp are fractions
(0..1; the table prints them as percentages); KL divergences are in nats.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from engine.bench.result import BenchError
from engine.files import write_text_atomic

SCHEMA = "candlewick-quality/1"


class _Model(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class ModelFileInfo(_Model):
    """A GGUF file as the result names it."""

    path: str
    name: str = Field(description="the file's name")
    size_bytes: int
    quantization: str = Field("", description="the file's type as its header says (Q4_K_M...)")


class ReferenceRow(ModelFileInfo):
    """The reference: the highest-precision file, scored as llama-perplexity scores it."""

    ppl: float
    ppl_err: float = Field(description="± of the perplexity, as llama-perplexity prints it")
    tokens_per_s: float = Field(description="text tokens decoded and scored per second")
    pass_s: float = Field(description="the reference pass's time (when it was made)")
    cached: bool = Field(description="its scores came from the cache: no pass this run")


class CandidateRow(ModelFileInfo):
    """A candidate against the reference: llama-perplexity's `--kl-divergence` report."""

    made_from: str | None = Field(None, description="quantized from the reference, as this type")
    ppl: float
    ppl_err: float
    ppl_ratio: float = Field(description="PPL(candidate) / PPL(reference)")
    ppl_ratio_err: float
    ln_ppl_ratio: float
    ln_ppl_ratio_err: float
    ppl_diff: float
    ppl_diff_err: float
    ppl_correlation: float = Field(description="correlation of the two log-perplexities")
    kld_mean: float
    kld_err: float = Field(description="± of the mean KL divergence")
    kld_median: float
    kld_p99: float
    kld_max: float
    kld_percentiles: dict[str, float] = Field(description="p99_9, p99, p95, p90, p10, p5, p1, p0_1")
    top1_agreement: float = Field(description="fraction of positions with the same top token")
    top1_err: float
    dp_mean: float = Field(description="mean change of the next token's probability")
    dp_err: float
    dp_median: float
    dp_rms: float
    dp_rms_err: float
    dp_max: float
    dp_min: float
    dp_percentiles: dict[str, float] = Field(
        description="p99_9, p99, p95, p90, p75, p25, p10, p5, p1, p0_1"
    )
    tokens_per_s: float
    pass_s: float


class TextInfo(_Model):
    source: str = Field(description="'built-in corpus', a file, 'chat …' or 'collection …'")
    sha256: str = Field(description="of the text's UTF-8 bytes")
    tokens: int = Field(description="the text's tokens in the reference's vocabulary")


class QualityResult(_Model):
    """One `bench quality` run (see the module doc)."""

    created: str = Field(description="ISO 8601, UTC")
    command: list[str] | None = None
    machine: dict[str, Any] = Field(default_factory=dict)
    reference: ReferenceRow
    text: TextInfo
    ctx: int = Field(description="tokens per chunk")
    n_batch: int = Field(description="tokens per decode")
    chunks: int
    scored_tokens: int = Field(description="positions scored: chunks x (ctx - 1 - ctx/2)")
    candidates: list[CandidateRow]

    def to_dict(self) -> dict[str, Any]:
        """The JSON object, `schema` first."""
        return {"schema": SCHEMA, **self.model_dump(mode="json")}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1, ensure_ascii=False) + "\n"

    def save(self, path: Path) -> None:
        """Write the JSON whole under `path`, or leave what was there (a temporary name,
        then a rename)."""
        write_text_atomic(path, self.to_json())

    @classmethod
    def from_dict(cls, data: Any) -> QualityResult:
        """A result read back; `BenchError` when `data` is not one."""
        if not isinstance(data, dict) or data.get("schema") != SCHEMA:
            raise BenchError("not a Candlewick quality result")
        try:
            return cls.model_validate(data)
        except ValidationError as e:
            first = e.errors()[0]
            where = ".".join(str(p) for p in first["loc"])
            raise BenchError(f"not a Candlewick quality result ({where}: {first['msg']})") from None

    @classmethod
    def load(cls, path: Path) -> QualityResult:
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (ValueError, UnicodeDecodeError):
            raise BenchError(f"{path.name} is not JSON") from None
        return cls.from_dict(data)


def is_quality_result(data: Any) -> bool:
    return isinstance(data, dict) and data.get("schema") == SCHEMA


__all__ = [
    "SCHEMA",
    "CandidateRow",
    "ModelFileInfo",
    "QualityResult",
    "ReferenceRow",
    "TextInfo",
    "is_quality_result",
]
