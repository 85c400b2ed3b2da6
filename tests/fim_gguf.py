"""SmolLM2 as a fill-in-the-middle model: the bundled SmolLM2 with metadata naming six of its
own control tokens as the FIM markers (tokenizer.ggml.fim_*_token_id), so that llama.cpp's
`llama_vocab_fim_*`, llama-server's /infill and Candlewick's take it.

The bundled file has StarCoder's repository tokens (`<reponame>`, `<file_sep>`) but no
`<fim_prefix>`/`<fim_suffix>`/`<fim_middle>`: llama.cpp finds FIM_REP by its text and nothing
else, and llama-server refuses /infill ("prefix token is missing"). The markers chosen are
control tokens SmolLM2's chat never writes: the Jupyter ones (ids 11-14) for PRE, SUF, MID and
PAD, and the repository ones for REP and SEP. The weights and the vocabulary are the same bytes;
the model was not trained on this layout, so what it writes in the middle is a greedy
continuation, not a good completion: enough to compare servers and check the prompt layout.
"""

from __future__ import annotations

import os
from pathlib import Path

from gguf import GGUFReader, GGUFValueType, GGUFWriter, Keys

# key -> (token id, the token's text in SmolLM2's vocabulary)
FIM_TOKENS: dict[str, tuple[int, str]] = {
    Keys.Tokenizer.FIM_PRE_ID: (11, "<jupyter_start>"),
    Keys.Tokenizer.FIM_SUF_ID: (12, "<jupyter_text>"),
    Keys.Tokenizer.FIM_MID_ID: (13, "<jupyter_code>"),
    Keys.Tokenizer.FIM_PAD_ID: (14, "<jupyter_output>"),
    Keys.Tokenizer.FIM_REP_ID: (4, "<reponame>"),
    Keys.Tokenizer.FIM_SEP_ID: (5, "<file_sep>"),
}
NAME = "SmolLM2-135M-Instruct with FIM markers (test)"
_OWN = ("GGUF.", "general.architecture")


def write_fim_model(source: Path, out: Path) -> Path:
    """Write `out` as `source` with the FIM token ids in its metadata (atomically); refuses a
    source whose vocabulary does not hold the chosen tokens where expected."""
    r = GGUFReader(source)
    arch = r.fields["general.architecture"].contents()
    tokens = r.fields["tokenizer.ggml.tokens"].contents()
    assert isinstance(tokens, list)
    for key, (tid, text) in FIM_TOKENS.items():
        if tid >= len(tokens) or tokens[tid] != text:
            raise ValueError(f"{source.name}: token {tid} is not {text!r} (for {key})")
    tmp = out.with_name(out.name + ".part")
    out.parent.mkdir(parents=True, exist_ok=True)
    w = GGUFWriter(tmp, str(arch))
    for name, f in r.fields.items():
        if name.startswith(_OWN) or name in FIM_TOKENS:
            continue
        value = f.contents()
        if name == "general.name":
            value = NAME
        main = f.types[0]
        if main == GGUFValueType.ARRAY:
            w.add_key_value(name, value, main, sub_type=f.types[-1])
        else:
            w.add_key_value(name, value, main)
    for key, (tid, _) in FIM_TOKENS.items():
        w.add_uint32(key, tid)
    for t in r.tensors:
        w.add_tensor(t.name, t.data, raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    os.replace(tmp, out)
    return out
