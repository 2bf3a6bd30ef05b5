"""The GGUF files in the models folder, described from their headers with the gguf package
(metadata only; the web app never loads weights or the engine)."""
from pathlib import Path

import gguf


def _scalar(reader: gguf.GGUFReader, key: str):
    field = reader.fields.get(key)
    return field.contents() if field is not None else None


def describe(path: Path) -> dict:
    try:
        reader = gguf.GGUFReader(path)
    except Exception as e:  # a broken or partial download: list it with the reason
        return {"name": path.stem, "file": path.name, "file_size": path.stat().st_size, "error": str(e)}
    arch = _scalar(reader, "general.architecture")
    file_type = _scalar(reader, "general.file_type")
    try:
        quant = gguf.LlamaFileType(file_type).name.removeprefix("MOSTLY_") if file_type is not None else None
    except ValueError:
        quant = str(file_type)
    return {"name": path.stem, "file": path.name, "file_size": path.stat().st_size, "architecture": arch,
            "quant": quant, "context_length": _scalar(reader, f"{arch}.context_length"),
            "parameters": sum(int(t.n_elements) for t in reader.tensors), "error": None}


def scan(models_dir: str | Path) -> list[dict]:
    folder = Path(models_dir)
    return [describe(p) for p in sorted(folder.glob("*.gguf"))] if folder.is_dir() else []
