"""The GGUF files in the models folder, described from their headers, and whether the workers
can serve each: its architecture and tensor types against vkllm/modelsupport.py (the engine's
own lists), its tensors' data against the file's size, the overrides file beside it as the
engine reads it (vkllm/overrides.py). Only the header is read (metadata and tensor infos, a few
MB for a large vocabulary; never the weights), once per file while its size and mtime stay the
same; the overrides file, a few hundred bytes, at every listing. The web app never loads weights
or the engine."""
import math
import struct
import threading
from pathlib import Path

from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, LlamaFileType

from vkllm import modelsupport, overrides
from vkllm.errors import VkllmError

CHUNK = 1 << 20          # bytes read at a time while walking a header
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
_cache: dict[str, tuple[tuple, dict]] = {}    # path -> ((size, mtime_ns, inode), description)
_lock = threading.Lock()


class _Short(Exception):
    """The header runs past the end of the file."""


class _Bad(Exception):
    """The file cannot be served: the message says why."""


class _Header:
    """A GGUF header read front to back in chunks, never past what it needs."""

    def __init__(self, f, size: int):
        self.f, self.size, self.buf, self.pos = f, size, bytearray(), 0

    def need(self, n: int) -> None:
        end = self.pos + n
        if end > self.size:
            raise _Short
        while len(self.buf) < end:
            more = self.f.read(max(CHUNK, end - len(self.buf)))
            if not more:
                raise _Short
            self.buf += more

    def unpack(self, fmt: str):
        n = struct.calcsize(fmt)
        self.need(n)
        (value,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += n
        return value

    def string(self) -> str:
        n = self.unpack("<Q")
        self.need(n)
        self.pos += n
        return bytes(self.buf[self.pos - n:self.pos]).decode("utf-8", "replace")

    def value(self, vtype: int):
        """A scalar or string value; an array is skipped (None)."""
        if vtype in _SCALARS:
            return self.unpack(_SCALARS[vtype])
        if vtype == _STRING:
            return self.string()
        if vtype != _ARRAY:
            raise _Bad(f"corrupt GGUF header: unknown metadata value type {vtype}")
        itype, count = self.unpack("<I"), self.unpack("<Q")
        if itype in _SCALARS:
            self.need(count * struct.calcsize(_SCALARS[itype]))
            self.pos += count * struct.calcsize(_SCALARS[itype])
        elif itype == _STRING:           # a vocabulary: hundreds of thousands of strings
            self._skip_strings(count)
        else:
            raise _Bad(f"corrupt GGUF header: array of unsupported type {itype}")
        return None

    def _skip_strings(self, count: int) -> None:
        unpack_from, buf, pos = struct.unpack_from, self.buf, self.pos
        for _ in range(count):
            if pos + 8 > len(buf):
                self.pos = pos
                self.need(8)
                buf = self.buf
            pos += 8 + unpack_from("<Q", buf, pos)[0]
            if pos > len(buf):
                self.pos = pos - 1
                self.need(1)                 # reads up to pos or finds the file too short
                buf = self.buf
        self.pos = pos
        self.need(0)


def _read(path: Path, size: int) -> dict:
    """What the header says; raises _Short or _Bad."""
    with open(path, "rb") as f:
        h = _Header(f, size)
        h.need(min(size, 4))
        magic = bytes(h.buf[:4])
        if magic != b"GGUF":
            raise _Bad(f"not a GGUF file (starts with {magic!r}, expected b'GGUF')")
        h.pos = 4
        version = h.unpack("<I")
        if version not in (2, 3):
            raise _Bad(f"unsupported GGUF version {version} (2 and 3 are read)")
        n_tensors, n_kv = h.unpack("<Q"), h.unpack("<Q")
        meta = {}
        for _ in range(n_kv):
            key = h.string()
            meta[key] = h.value(h.unpack("<I"))
        tensors = []
        for _ in range(n_tensors):
            name = h.string()
            n_dims = h.unpack("<I")
            if n_dims > 8:
                raise _Bad(f"corrupt GGUF header: tensor '{name}' has {n_dims} dimensions")
            dims = [h.unpack("<Q") for _ in range(n_dims)]
            tensors.append((name, dims, h.unpack("<I"), h.unpack("<Q")))
        alignment = meta.get("general.alignment", 32)
        if not isinstance(alignment, int) or alignment <= 0:
            raise _Bad(f"corrupt GGUF header: general.alignment is {alignment!r}")
        data_start = -(-h.pos // alignment) * alignment
    return {"meta": meta, "tensors": tensors, "data_start": data_start, "alignment": alignment}


def _problem(header: dict, size: int) -> str | None:
    """Why the workers would refuse the file, or None: what the engine checks on opening it that
    a header shows (architecture, tensor types and byte ranges)."""
    problem = modelsupport.unsupported_architecture(header["meta"].get("general.architecture"))
    if problem:
        return problem
    if not any(t[0] == "token_embd.weight" for t in header["tensors"]):   # a vocabulary-only file
        return f"required tensor 'token_embd.weight' is missing ({header['meta']['general.architecture']} model)"
    ranges = []
    for name, dims, raw_type, offset in header["tensors"]:
        try:
            ggml_type = GGMLQuantizationType(raw_type)
        except ValueError:
            return f"tensor '{name}' has unknown type id {raw_type}"
        problem = modelsupport.unsupported_type(name, ggml_type.name)
        if problem:
            return problem
        block, type_size = GGML_QUANT_SIZES[ggml_type]
        if not dims or dims[0] % block:
            return f"tensor '{name}' has shape {dims}, rows not a multiple of {ggml_type.name}'s block of {block}"
        ranges.append((offset, math.prod(dims) // block * type_size, name))
    return modelsupport.tensor_data_problem(ranges, header["data_start"], size, header["alignment"])


def _quant(file_type) -> str | None:
    if file_type is None:
        return None
    try:
        return LlamaFileType(file_type).name.removeprefix("MOSTLY_")
    except ValueError:
        return str(file_type)


def describe(path: Path, size: int) -> dict:
    """The file as the models page lists it; `error` is why the workers cannot serve it (None:
    they can, as far as its header tells)."""
    out = {"name": path.stem, "file": path.name, "file_size": size, "architecture": None, "quant": None,
           "context_length": None, "parameters": None, "error": None}
    try:
        header = _read(path, size)
    except _Short:
        return out | {"error": f"truncated or corrupt GGUF header: it runs past the end of the file ({size} bytes)"}
    except _Bad as e:
        return out | {"error": str(e)}
    except OSError as e:
        return out | {"error": f"cannot read it: {e.strerror}"}
    meta = header["meta"]
    arch = meta.get("general.architecture")
    parameters = sum(math.prod(dims) for _, dims, _, _ in header["tensors"])
    return out | {"architecture": arch, "quant": _quant(meta.get("general.file_type")),
                  "context_length": meta.get(f"{arch}.context_length"), "parameters": parameters,
                  "error": _problem(header, size)}


def scan(models_dir: str | Path) -> list[dict]:
    """Every *.gguf in the folder, by name; a file read before and unchanged since is not read again."""
    folder = Path(models_dir)
    if not folder.is_dir():
        return []
    found = []
    for path in sorted(folder.glob("*.gguf")):
        try:
            st = path.stat()
        except OSError:
            continue                     # removed meanwhile
        stamp = (st.st_size, st.st_mtime_ns, st.st_ino)
        cached = _cache.get(str(path))
        if cached is None or cached[0] != stamp:
            cached = (stamp, describe(path, st.st_size))
            with _lock:
                _cache[str(path)] = cached
        found.append(cached[1] if cached[1]["error"] else cached[1] | {"error": _overrides_problem(path)})
    return found


def _overrides_problem(path: Path) -> str | None:
    """Why the engine would refuse the overrides file beside the GGUF at path, or None."""
    try:
        overrides.read(path)
    except VkllmError as e:
        return str(e)
    return None
