"""A GGUF file's F32 twin, for llama.cpp goldens computed in float32 over the same weights
(tests/tools/make_refmodel_goldens.py, make_moe_goldens.py)."""
from pathlib import Path

from gguf import GGUFReader, GGUFValueType, GGUFWriter

from worker.engine.modelfile import ModelFile


def dequantized_copy(src: Path, dst: Path) -> Path:
    """src with the same metadata and every tensor as F32."""
    reader, model = GGUFReader(src), ModelFile.open(src)
    writer = GGUFWriter(dst, model.architecture)
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        sub_type = field.types[-1] if field.types[0] == GGUFValueType.ARRAY else None
        writer.add_key_value(name, field.contents(), field.types[0], sub_type)
    for name in model.tensors:
        writer.add_tensor(name, model.dequantize(name))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return dst
