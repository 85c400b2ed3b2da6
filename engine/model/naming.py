"""One readable name per model file, and the machine id made from it.

A GGUF file names its model three ways that rarely agree: the file name the publisher chose
("SmolLM2-135M-Instruct.Q4_1.gguf"), `general.name` written by the converter (often the
training run's folder: "Smollm2 135M 8k Lc100K Mix1 Ep2") and, for a download, the repository
("bartowski/Qwen2.5-7B-Instruct-GGUF"). `derive_name` makes one name for people out of them:

- the file name's words come first (what the file was published as), without the split suffix
  (`-00001-of-00003`), the `.gguf` extension and the quantization, which comes back at the end:
  "SmolLM2 135M Instruct · Q4_1";
- when the file name says nothing (an Ollama blob `sha256-…`, `model.gguf`,
  `ggml-model-q4_0.gguf`), `general.name` is used unless it looks like a training-run id,
  then the repository or Ollama tag, then `general.basename` + `general.size_label`;
- lower-case words take their capitals from `general.name`/`general.basename` when these spell
  the same word ("gemma" -> "Gemma"), else from a short list of families ("smollm2" ->
  "SmolLM2"); size labels are upper-cased ("270m" -> "270M").

`model_slug` turns a name into an id for machines (the Local server's HTTP model id).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

SEPARATOR = " · "  # between the model's words and its quantization

# A quantization label as it appears in file names (case-insensitive): Q4_K_M, IQ4_XS, Q8_0,
# Q4_0_4_4, TQ1_0, BF16, F16, MXFP4, unsloth's UD-Q4_K_XL. It must stand as its own word.
_QUANT = re.compile(
    r"(?i)(?:^|[-_. ])((?:UD-)?I?Q\d(?:_[A-Z0-9]+)*|TQ\d_\d|MXFP4(?:_MOE)?|BF16|FP16|FP32|F16|F32)"
    r"(?=$|[-_. ])"
)
_SPLIT = re.compile(r"(?i)-\d{5}-of-\d{5}$")
# Word boundaries: dashes, underscores, spaces, and dots that are not inside a number (3.1).
_WORD_SEP = re.compile(r"[-_\s]+|(?<!\d)\.|\.(?!\d)")
_SIZE = re.compile(r"(?i)^(\d+x)?\d+(\.\d+)?[kmbt]$")
_HASH = re.compile(r"(?i)^(sha256[-:])?[0-9a-f]{16,}$")
# Markers of a training run's folder name rather than a model's: epochs, data mixes, steps,
# checkpoints, long numbers, hashes.
_RUN_MARK = re.compile(
    r"(?i)\b(ep(och)?\d+|mix\d+|lc\d+k?|step\d+|ckpt\d*|checkpoint\d*|run\d+|seed\d+|"
    r"lr\d\S*|bs\d+|\d{6,}|[0-9a-f]{10,})\b"
)
# Words that say nothing about which model it is.
_GENERIC = frozenset(
    {
        "model",
        "models",
        "ggml",
        "gguf",
        "weights",
        "merged",
        "output",
        "out",
        "final",
        "hf",
        "converted",
        "unnamed",
        "latest",
        "default",
        "sha256",
    }
)
# How people write these words (checked after the metadata's own spelling).
_SPECIAL = {
    "it": "IT",
    "qat": "QAT",
    "moe": "MoE",
    "hf": "HF",
    "gpt": "GPT",
    "oss": "OSS",
    "vl": "VL",
    "r1": "R1",
}
_FAMILIES = (
    "SmolLM",
    "DeepSeek",
    "TinyLlama",
    "CodeLlama",
    "OpenHermes",
    "StarCoder",
    "InternLM",
    "MiniCPM",
    "ChatGLM",
    "OLMo",
    "OpenChat",
    "EXAONE",
    "GPT",
    "GLM",
    "Qwen",
    "Llama",
    "Gemma",
    "Mistral",
    "Mixtral",
    "Phi",
    "Falcon",
    "Granite",
    "Hermes",
    "Yi",
    "Command",
    "Nemotron",
    "Zephyr",
    "Vicuna",
    "Orca",
)


def _words(text: str) -> list[str]:
    return [w for w in _WORD_SEP.split(text) if w]


def split_quantization(stem: str) -> tuple[str, str]:
    """A file stem without its quantization label, and the label (upper case; '' if none)."""
    matches = list(_QUANT.finditer(stem))
    if not matches:
        return stem, ""
    m = matches[-1]  # the label is the last one ("Q4_K_M" in "Qwen2.5-7B-Instruct-Q4_K_M")
    return (stem[: m.start()] + stem[m.end() :]).strip("-_. "), m[1].upper()


def file_stem(file_name: str) -> str:
    """The name without folders, `.gguf` and a split model's `-0000N-of-0000M`."""
    stem = re.sub(r"(?i)\.gguf$", "", file_name.replace("\\", "/").rsplit("/", 1)[-1])
    stem = _SPLIT.sub("", stem)
    return re.sub(r"(?i)[-_.]gguf$", "", stem)


def is_generic(words: list[str]) -> bool:
    """Words that do not tell one model from another: none, only generic ones, or a hash."""
    meaningful = [w for w in words if w.lower() not in _GENERIC]
    return not meaningful or all(_HASH.match(w) or w.isdigit() for w in meaningful)


def says_nothing(file_name: str) -> bool:
    """A file name that does not tell which model it is (`model.gguf`, an Ollama blob)."""
    return is_generic(_words(split_quantization(file_stem(file_name))[0]))


def looks_like_run_id(name: str) -> bool:
    """`general.name` written from a training run's folder ("Smollm2 135M 8k Lc100K Mix1 Ep2")
    rather than the model's name."""
    return bool(_RUN_MARK.search(name))


def _case_map(*sources: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for source in sources:
        for w in _words(source):
            if w != w.lower() and not _SIZE.match(w):
                out.setdefault(w.lower(), w)
    return out


def _cased(word: str, known: Mapping[str, str]) -> str:
    low = word.lower()
    if _SIZE.match(word):
        return word[:-1] + word[-1].upper()
    if word != low:
        return word  # the publisher's own capitals
    if low in _SPECIAL:
        return _SPECIAL[low]
    if low in known and known[low] != word.capitalize():  # "DeepSeek", not "Smollm2"
        return known[low]
    for family in _FAMILIES:
        if low.startswith(family.lower()):
            return family + low[len(family) :]
    if word.isalpha():
        return word.capitalize()
    if re.fullmatch(r"[a-uw-z]\d+", low):  # r1, k2 (but v2 stays a version)
        return word.upper()
    return word


def _readable(words: list[str], known: Mapping[str, str]) -> str:
    return " ".join(_cased(w, known) for w in words if w.lower() not in ("gguf",))


def _origin_words(origin: str) -> list[str]:
    """Words of where a file came from: "owner/Repo-GGUF/file.gguf" -> the repository's;
    an Ollama tag "llama3.2:3b" -> "llama3.2", "3b" ("latest" says nothing)."""
    parts = [p for p in origin.replace("\\", "/").split("/") if p]
    if len(parts) >= 2 and parts[-1].lower().endswith(".gguf"):
        parts = parts[:-1]
    if not parts:
        return []
    last = parts[-1]
    if ":" in last:
        name, _, tag = last.partition(":")
        return _words(name) + ([] if tag in ("", "latest") else _words(tag))
    return _words(file_stem(last))


def derive_name(
    file_name: str,
    metadata: Mapping[str, Any] | None = None,
    *,
    quantization: str | None = None,
    origin: str | None = None,
) -> str:
    """The one name the app shows for a model file (see the module's docstring).

    `metadata`: the GGUF's (only `general.*` is read); `quantization`: the file type's label
    (ModelFacts.quantization), used when the file name has none; `origin`: where the file
    came from ("owner/repo/file.gguf", an Ollama "name:tag")."""
    md = metadata or {}
    general = str(md.get("general.name") or "").strip()
    basename = str(md.get("general.basename") or "").strip()
    size_label = str(md.get("general.size_label") or "").strip()
    stem, quant = split_quantization(file_stem(file_name))
    known_quant = (quantization or "").upper()
    if known_quant in ("", "UNKNOWN") or known_quant.startswith("FTYPE"):
        known_quant = ""
    # The file's own label tells variants of one repository apart (UD-Q4_K_XL); the file
    # type's is more precise when the file name abbreviates it (q4 -> Q4_K_M).
    if known_quant and (not quant or known_quant.startswith(quant + "_")):
        quant = known_quant
    known = _case_map(general, basename)
    words = _words(stem)
    if is_generic(words):
        words = []
        candidates: list[list[str]] = []
        if general and not looks_like_run_id(general):
            candidates.append(_words(split_quantization(general)[0]))
        if origin:
            candidates.append(_words(split_quantization(" ".join(_origin_words(origin)))[0]))
        if basename:
            base = _words(basename)
            if size_label and size_label.lower() not in (w.lower() for w in base):
                base.append(size_label)
            candidates.append(base)
        candidates.append(_words(general))
        for c in candidates:
            if not is_generic(c):
                words = c
                break
    name = _readable(words, known) or file_stem(file_name) or "Model"
    return f"{name}{SEPARATOR}{quant}" if quant else name


def model_slug(name: str) -> str:
    """An id for machines from a name: lower case, letters, digits, '.', '_' and '-'
    ("SmolLM2 135M Instruct · Q4_1" -> "smollm2-135m-instruct-q4_1")."""
    slug = re.sub(r"[^a-z0-9._]+", "-", name.lower())
    return re.sub(r"-{2,}", "-", slug).strip("-.") or "model"
