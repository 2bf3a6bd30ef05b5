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
    rows) per mat-vec workgroup measured for this weight on this device (worker/engine/kernels/tuning.py);
    None takes the device kind's fixed shape."""
    ggml_type: GGMLQuantizationType
    rows: int
    cols: int
    parts: list[tuple[Buffer, int, int]] = field(default_factory=list)
    mat_vec_shape: tuple[int, int] | None = None
    glu_shape: tuple[int, int] | None = None    # through the fused gate+up kernel, as the gate
    coopmat_tile: tuple[int, ...] | None = None  # the cooperative-matrix mat-mat tile (matmul.py COOPMAT_TILE)
    experts: int = 1                            # stacked matrices of rows / experts rows each

    @property
    def row_bytes(self) -> int:
        return row_bytes(self.ggml_type, self.cols)

    @property
    def nbytes(self) -> int:
        return self.rows * self.row_bytes


def upload_tensor(ctx, name: str, ggml_type: GGMLQuantizationType, shape, data_uint8) -> DeviceTensor:
    """`shape` in GGUF order (ne[0] = row length first); dimensions past the first are rows, a
    third one the number of experts."""
    ggml_type = GGMLQuantizationType(ggml_type)
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
    for buffer, _, _ in tensor.parts:
        ctx.free(buffer)
    tensor.parts = []

