"""A copy of a GGUF file with some tensors stored in another quantization type.

Used to make a batch-invariant twin of the bundled SmolLM2 for the tests that compare greedy
text across batching paths: its token embedding (also its tied output matrix) is Q8_0, a type
llamafile's sgemm multiplies differently for one row and many on x86; as Q4_1, like its layers,
every product takes ggml's own dot product (engine.memory.cpu_kernels).
"""

from __future__ import annotations

import os
from pathlib import Path

from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter
from gguf.quants import dequantize, quantize

# Fields the writer sets itself (or the reader made up), not copied from the source.
_OWN = ("GGUF.", "general.architecture")


def requantize(source: Path, out: Path, types: dict[str, GGMLQuantizationType]) -> Path:
    """Write `out` as `source` with the tensors named in `types` converted (atomically: the
    file appears whole or not at all)."""
    r = GGUFReader(source)
    arch = r.fields["general.architecture"].contents()
    tmp = out.with_suffix(".partial")
    w = GGUFWriter(tmp, str(arch))
    for name, f in r.fields.items():
        if name.startswith(_OWN):
            continue
        main = f.types[0]
        if main == GGUFValueType.ARRAY:
            w.add_key_value(name, f.contents(), main, sub_type=f.types[-1])
        else:
            w.add_key_value(name, f.contents(), main)
    for t in r.tensors:
        target = types.get(t.name)
        if target is None or target == t.tensor_type:
            w.add_tensor(t.name, t.data, raw_dtype=t.tensor_type)
            continue
        values = dequantize(t.data, t.tensor_type)
        w.add_tensor(t.name, quantize(values, target), raw_dtype=target)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    os.replace(tmp, out)
    return out
