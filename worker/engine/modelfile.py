"""A GGUF model file, memory-mapped and validated before anything is uploaded.

gguf.GGUFReader does the parsing; a damaged file makes it fail with whatever numpy raises, so
the checks that matter to a user (not a GGUF, truncated, tensor data outside the file,
unsupported architecture or tensor type, missing tensor) run first or wrap it, and each gives
one GGUFError line naming the file and the problem.
"""
import struct
import sys
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFReader, GGUFValueType

from vkllm import modelsupport, overrides
from vkllm.errors import VkllmError
from worker.engine.errors import GGUFError
from worker.engine.models.config import ModelConfig


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]           # GGUF ne order: shape[0] is the row length
    ggml_type: GGMLQuantizationType
    n_bytes: int
    data: np.ndarray                 # uint8 view into the memory map, n_bytes long

    @property
    def n_elements(self) -> int:
        return int(np.prod(self.shape))


class _CheckedReader(GGUFReader):
    """GGUFReader that checks tensor types and byte ranges before it slices the memory map
    (where a bad range would otherwise end in an unrelated numpy reshape error), and slices a
    plain ndarray view of the map: np.memmap's per-slice bookkeeping made opening a file with
    a 128k-token vocabulary take 16 s; string arrays (vocabularies, merges) take a fast path
    (one part per string, as GGUFReader builds them) and numeric arrays become one part, which
    brings it to about a second."""

    def _plain(self) -> np.ndarray:
        plain = self.__dict__.get("_plain_view")
        if plain is None or plain.base is not self.data:
            plain = self._plain_view = self.data.view(np.ndarray)
        return plain

    def _get(self, offset, dtype, count=1, override_order=None):
        count = int(count)
        arr = self._plain()[offset:offset + np.dtype(dtype).itemsize * count].view(dtype)[:count]
        return arr.view(arr.dtype.newbyteorder(self.byte_order if override_order is None else override_order))

    def _get_field_parts(self, orig_offs, raw_type):
        if raw_type != GGUFValueType.ARRAY or self.byte_order != "I" or sys.byteorder != "little":
            return super()._get_field_parts(orig_offs, raw_type)
        raw_itype, alen = self._get(orig_offs, np.uint32), self._get(orig_offs + 4, np.uint64)
        itype = GGUFValueType(int(raw_itype[0]))
        if itype in self.gguf_scalar_to_np:       # one part holding the whole array
            values = self._get(orig_offs + 12, self.gguf_scalar_to_np[itype], int(alen[0]))
            if len(values) != int(alen[0]):
                raise IndexError("array runs past the end of the file")
            return 12 + values.nbytes, [raw_itype, alen, values], [2], [GGUFValueType.ARRAY, itype]
        if itype != GGUFValueType.STRING:
            return super()._get_field_parts(orig_offs, raw_type)
        plain = self._plain()
        parts, idxs, offs = [raw_itype, alen], [], orig_offs + 12
        raw = memoryview(plain)
        for _ in range(int(alen[0])):
            (length,) = struct.unpack_from("<Q", raw, offs)
            if offs + 8 + length > len(plain):
                raise IndexError("string runs past the end of the file")
            parts += [plain[offs:offs + 8].view(np.uint64), plain[offs + 8:offs + 8 + length]]
            idxs.append(len(parts) - 1)
            offs += 8 + length
        return offs - orig_offs, parts, idxs, [GGUFValueType.ARRAY, GGUFValueType.STRING]

    def _build_tensors(self, start_offs, fields):
        file_size = len(self.data)
        ranges = []
        for field in fields:
            _, name_data, _, dims, raw_dtype, offset = field.parts
            name = bytes(name_data).decode("utf-8", "replace")
            ggml_type = _tensor_type(name, int(raw_dtype[0]))
            block, type_size = GGML_QUANT_SIZES[ggml_type]
            n_elements = int(np.prod(dims.astype(np.uint64)))
            if dims.size == 0 or int(dims[0]) % block:
                raise GGUFError(f"tensor '{name}' has shape {dims.tolist()}, rows not a multiple "
                                f"of {ggml_type.name}'s block of {block}")
            ranges.append((int(offset[0]), n_elements // block * type_size, name))
        _check_ranges(ranges, start_offs, file_size, self.alignment)
        super()._build_tensors(start_offs, fields)


def _tensor_type(name: str, raw: int) -> GGMLQuantizationType:
    try:
        ggml_type = GGMLQuantizationType(raw)
    except ValueError:
        raise GGUFError(f"tensor '{name}' has unknown type id {raw}") from None
    problem = modelsupport.unsupported_type(name, ggml_type.name)
    if problem:
        raise GGUFError(problem)
    return ggml_type


def _check_ranges(ranges, data_start: int, file_size: int, alignment: int) -> None:
    problem = modelsupport.tensor_data_problem(ranges, data_start, file_size, alignment)
    if problem:
        raise GGUFError(problem)


def _field_value(field) -> Any:
    """A metadata field as a plain Python value (arrays as lists)."""
    if field.types[:1] == [GGUFValueType.ARRAY] and field.types[-1] != GGUFValueType.STRING:
        parts = [field.parts[i] for i in field.data]
        return np.concatenate(parts).tolist() if parts else []
    return field.contents()


@dataclass
class ModelFile:
    path: Path
    metadata: dict[str, Any]
    tensors: dict[str, TensorInfo]
    file_size: int
    overridden: tuple[str, ...] = ()   # metadata keys whose values come from the overrides file

    @classmethod
    def open(cls, path) -> "ModelFile":
        """The GGUF at path, its metadata with the overrides kept beside it applied
        (vkllm/overrides.py)."""
        path = Path(path)
        try:
            with open(path, "rb") as f:
                magic = f.read(4)
        except OSError as e:
            raise GGUFError(f"cannot read {path}: {e.strerror}") from None
        if magic != b"GGUF":
            raise GGUFError(f"{path} is not a GGUF file (starts with {magic!r}, expected b'GGUF')")
        try:
            reader = _CheckedReader(path)
            metadata = {name: _field_value(field) for name, field in reader.fields.items()
                        if not name.startswith("GGUF.")}
        except GGUFError as e:
            raise GGUFError(f"{path}: {e}") from None
        except (ValueError, IndexError, KeyError, OverflowError, UnicodeDecodeError,
                MemoryError, struct.error) as e:
            raise GGUFError(f"{path}: truncated or corrupt GGUF header ({type(e).__name__}: "
                            f"{str(e)[:120]})") from None
        tensors = {t.name: TensorInfo(t.name, tuple(int(d) for d in t.shape),
                                      GGMLQuantizationType(t.tensor_type), int(t.n_bytes),
                                      t.data.reshape(-1).view(np.uint8))
                   for t in reader.tensors}
        try:
            extra = overrides.read(path)
        except VkllmError as e:
            raise GGUFError(str(e)) from None
        model = cls(path, metadata | extra, tensors, len(reader.data), tuple(extra))
        try:
            model.config.check_tensors(model.tensors)
        except GGUFError as e:
            raise GGUFError(f"{path}: {e}") from None
        return model

    @property
    def architecture(self) -> str:
        return self.metadata.get("general.architecture", "")

    @cached_property
    def config(self):
        """The architecture's ModelConfig; raises GGUFError for an unsupported architecture."""
        return ModelConfig.from_metadata(self.metadata, self.tensors)

    def dequantize(self, name: str) -> np.ndarray:
        """A tensor as float32 in numpy order (shape reversed: rows last-but-one)."""
        from gguf.quants import dequantize
        t = self.tensors[name]
        values = dequantize(t.data, t.ggml_type)
        return np.asarray(values, dtype=np.float32).reshape(tuple(reversed(t.shape)))

    @property
    def n_params(self) -> int:
        return sum(t.n_elements for t in self.tensors.values())
