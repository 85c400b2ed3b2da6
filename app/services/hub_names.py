"""Hugging Face model names as Ollama clients write them, and the file a name means.

`hf.co/owner/repo:Q4_K_M` (also `huggingface.co/...`, and `owner/repo:Q4_K_M`, since
Candlewick pulls from no other registry) names a repository's GGUF model of that
quantization; without a tag (or with `latest`) the default one is taken as Ollama does:
Q4_K_M when the repository has it, else another 4-bit one, else the smallest.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from app.services.hub import ModelVariant, RepoDetails
from app.services.projectors import choose_projector
from engine.server.model_store import LATEST, full_name

_HUB_NAME = re.compile(
    r"^(?:https?://)?(?:(?:hf\.co|huggingface\.co)/)?"
    r"(?!(?:hf\.co|huggingface\.co)/)"  # the host alone is not an owner
    r"(?P<repo>[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*)(?::(?P<tag>[\w.-]+))?$"
)
DEFAULT_QUANT = "Q4_K_M"


@dataclass(frozen=True)
class HubName:
    name: str  # as it will be listed: the given name with its tag
    repo_id: str
    tag: str  # a quantization, or `latest`


def parse_hub_name(name: str) -> HubName | None:
    """The Hub repository and tag a name means, or None for a name that is not a Hub one."""
    m = _HUB_NAME.match(name.strip())
    if m is None:
        return None
    return HubName(full_name(name.strip()), m["repo"], m["tag"] or LATEST)


def choose_variant(details: RepoDetails, tag: str) -> ModelVariant | None:
    """The repository's complete GGUF model for `tag` (a quantization, any case; `latest`:
    the default one), or None."""
    models = [v for v in details.variants if v.kind == "model" and v.complete]
    if tag.casefold() != LATEST:
        want = tag.upper()
        return next((v for v in models if v.quantization.upper() == want), None)
    if not models:
        return None
    default = [v for v in models if v.quantization == DEFAULT_QUANT]
    four_bit = [v for v in models if re.match(r"I?Q4", v.quantization)]
    return (default or four_bit or sorted(models, key=lambda v: v.size))[0]


def projector_of(details: RepoDetails, variant: ModelVariant) -> ModelVariant | None:
    """The repository's projector for `variant` (app.services.projectors' rule): a vision or
    audio model comes with it."""
    found = {v.name: v for v in details.variants if v.kind == "projector" and v.complete}
    chosen = choose_projector(Path(variant.name), (Path(n) for n in found))
    return found[chosen.name] if chosen is not None else None


def quantizations(details: RepoDetails) -> list[str]:
    return sorted({v.quantization for v in details.variants if v.kind == "model"})


__all__ = ["HubName", "choose_variant", "parse_hub_name", "projector_of", "quantizations"]
