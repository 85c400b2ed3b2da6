"""SmolLM2 as SmolVLM's text model: the bundled SmolLM2 with the two image tokens libmtmd's
idefics3 layout looks up (`<fake_token_around_image>`, `<global-img>`) in its vocabulary.

SmolVLM's language model is SmolLM2 with these tokens added; the bundled file lacks them, so
libmtmd writes -1 where they go, which llama-server refuses ("Invalid token") and Candlewick
drops. To run both servers on the same pair (the test projector, tests/projector_gguf.py,
and this), two of SmolLM2's unused control tokens (`<jupyter_script>`, `<empty_output>`,
ids 15 and 16) are renamed; the weights are the same bytes. Answers stay meaningless.
"""

from __future__ import annotations

import os
from pathlib import Path

from gguf import GGUFReader, GGUFValueType, GGUFWriter

RENAMED = {15: "<fake_token_around_image>", 16: "<global-img>"}
NAME = "SmolLM2-135M-Instruct with SmolVLM's image tokens (test)"
_OWN = ("GGUF.", "general.architecture")


def write_smolvlm_text(source: Path, out: Path) -> Path:
    """Write `out` as `source` with the image tokens (atomically)."""
    r = GGUFReader(source)
    arch = r.fields["general.architecture"].contents()
    tmp = out.with_name(out.name + ".part")
    out.parent.mkdir(parents=True, exist_ok=True)
    w = GGUFWriter(tmp, str(arch))
    for name, f in r.fields.items():
        if name.startswith(_OWN):
            continue
        value = f.contents()
        if name == "tokenizer.ggml.tokens":
            assert isinstance(value, list)
            value = [RENAMED.get(i, t) for i, t in enumerate(value)]
        elif name == "general.name":
            value = NAME
        main = f.types[0]
        if main == GGUFValueType.ARRAY:
            w.add_key_value(name, value, main, sub_type=f.types[-1])
        else:
            w.add_key_value(name, value, main)
    for t in r.tensors:
        w.add_tensor(t.name, t.data, raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    os.replace(tmp, out)
    return out
