"""Weight tensors on the device, kept in their GGUF block format. A tensor whose bytes exceed
the device's storage-buffer binding range (128 MiB on lavapipe, 4 GiB on big GPUs) is split by
rows into parts, each bound on its own; kernels run once per part. A 3-D tensor (a mixture of
experts' [n_expert, rows, K]) is `experts` matrices stacked by rows, split only between experts."""
from dataclasses import dataclass, field
from math import prod

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from vkllm.errors import VkllmError
from worker.engine.intmath import round_up
from worker.engine.vk.memory import Buffer
from worker.engine.weight_types import WEIGHT_TYPES, row_bytes


@dataclass(eq=False)
class DeviceTensor:
    """A 2-D weight: `rows` rows of `cols` values (GGUF ne[1] and ne[0]); parts are
    (buffer, first_row, n_rows) covering the rows in order. `mat_vec_shape` is the (threads,
    rows, lanes) per mat-vec workgroup measured for this weight on this device
    (worker/engine/kernels/tuning.py); None takes the device kind's fixed shape."""
    ggml_type: GGMLQuantizationType
    rows: int
    cols: int
    parts: list[tuple[Buffer, int, int]] = field(default_factory=list)
    mat_vec_shape: tuple[int, int, int] | None = None
    glu_shape: tuple[int, int, int] | None = None    # through the fused gate+up kernel, as the gate
    coopmat_tile: tuple[int, ...] | None = None  # the cooperative-matrix mat-mat tile (coopmat.py COOPMAT_TILE)
    # (columns, through the gate+up kernel) -> the 8-bit mat-cols shape measured for it (cols_tuning.py)
    cols_shapes: dict[tuple[int, bool], tuple[int, int, int, int, int]] = field(default_factory=dict)
    experts: int = 1                            # stacked matrices of rows / experts rows each
    sections: tuple[int, ...] = ()   # rows of each weight, when this tensor is several (upload_rows)
    base: "DeviceTensor | None" = None   # the tensor whose buffer holds this view's rows

    @property
    def row_bytes(self) -> int:
        return row_bytes(self.ggml_type, self.cols)

    @property
    def nbytes(self) -> int:
        return self.rows * self.row_bytes

    @property
    def key(self) -> tuple[GGMLQuantizationType, int, int]:
        """(type, rows, K): how the tuners' tables name a weight (tuning.Key)."""
        return self.ggml_type, self.rows, self.cols


def _rows_data(name: str, ggml_type: GGMLQuantizationType, shape, data_uint8) -> tuple[int, int, np.ndarray]:
    """(cols, rows, bytes) of a weight, checked."""
    if ggml_type not in WEIGHT_TYPES:
        raise VkllmError(f"tensor {name}: type {ggml_type.name} is not supported")
    cols, rows = int(shape[0]), prod(int(d) for d in shape[1:])
    block = GGML_QUANT_SIZES[ggml_type][0]
    if cols % block:
        raise VkllmError(f"tensor {name}: row length {cols} is not a multiple of {ggml_type.name}'s block {block}")
    data = np.ascontiguousarray(data_uint8).reshape(-1).view(np.uint8)
    stride = row_bytes(ggml_type, cols)
    if data.nbytes != rows * stride:
        raise VkllmError(f"tensor {name}: {data.nbytes} bytes for {rows} rows of {stride} bytes")
    return cols, rows, data


def upload_rows(ctx, name: str, ggml_type: GGMLQuantizationType, shapes, datas) -> tuple[DeviceTensor, list[DeviceTensor]] | None:
    """Weights of one type and row length (GGUF shapes and bytes) as one tensor, their rows one
    after the other, with a view of each (its rows of the same buffer): the Q, K and V
    projections that one mat-vec takes. None where that tensor would be split into parts, or a
    weight's first byte would break the storage-buffer offset alignment (its view could not be
    bound): the caller uploads them one by one."""
    ggml_type = GGMLQuantizationType(ggml_type)
    checked = [_rows_data(f"{name}[{i}]", ggml_type, shape, data) for i, (shape, data) in enumerate(zip(shapes, datas))]
    if len({cols for cols, _, _ in checked}) != 1:
        raise VkllmError(f"tensor {name}: the weights differ in row length")
    sizes = [data.nbytes for _, _, data in checked]
    cols, rows = checked[0][0], sum(r for _, r, _ in checked)
    if rows > (ctx.max_binding_range & ~15) // row_bytes(ggml_type, cols) or any(size % ctx.alignment for size in sizes[:-1]):
        return None
    fused = upload_tensor(ctx, name, ggml_type, (cols, rows), np.concatenate([data for _, _, data in checked]))
    fused.sections = tuple(r for _, r, _ in checked)
    buffer, views, offset = fused.parts[0][0], [], 0
    for (_, r, _), size in zip(checked, sizes):
        views.append(DeviceTensor(ggml_type, r, cols, [(buffer.sub(offset, size), 0, r)], base=fused))
        offset += size
    return fused, views


def upload_tensor(ctx, name: str, ggml_type: GGMLQuantizationType, shape, data_uint8) -> DeviceTensor:
    """`shape` in GGUF order (ne[0] = row length first); dimensions past the first are rows, a
    third one the number of experts."""
    ggml_type = GGMLQuantizationType(ggml_type)
    cols, rows, data = _rows_data(name, ggml_type, shape, data_uint8)
    stride = row_bytes(ggml_type, cols)
    experts = int(shape[2]) if len(shape) > 2 else 1
    unit = rows // experts if experts > 1 else 1     # rows that stay in one part: a row, or an expert's
    per_part = (ctx.max_binding_range & ~15) // stride // unit * unit  # parts are padded to 16 bytes
    if per_part == 0:
        what = "one row" if experts == 1 else "one expert"
        raise VkllmError(f"tensor {name}: {what} ({stride * unit} bytes) exceeds the binding range")
    tensor = DeviceTensor(ggml_type, rows, cols, experts=experts)
    for first in range(0, rows, per_part):
        count = min(per_part, rows - first)
        buffer = ctx.alloc(round_up(count * stride, 16))  # float kernels read 4-vectors
        ctx.upload(buffer, data[first * stride:(first + count) * stride])
        tensor.parts.append((buffer, first, count))
    return tensor


def free_tensor(ctx, tensor: DeviceTensor):
    """A view (upload_rows) holds no memory of its own: freeing its base frees it."""
    if tensor.base is not None:
        return
    for buffer, _, _ in tensor.parts:
        ctx.free(buffer)
    tensor.parts = []

