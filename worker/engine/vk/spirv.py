"""A kernel's push-constant block read from its SPIR-V: member names, byte offsets and scalar
types, so that a dispatch packs push constants by name and the GLSL `layout(push_constant)`
block stays their one definition. The names come from debug instructions (OpName,
OpMemberName), which an optimized build strips: shaderbuild keeps an unoptimized build of each
variant for this, and the layout it gives is checked against the optimized kernel's own."""
import struct
from dataclasses import dataclass

MAGIC = 0x07230203
OP_MEMBER_NAME, OP_TYPE_INT, OP_TYPE_FLOAT, OP_TYPE_STRUCT = 6, 21, 22, 30
OP_TYPE_POINTER, OP_VARIABLE, OP_MEMBER_DECORATE = 32, 59, 72
DECORATION_OFFSET = 35
STORAGE_PUSH_CONSTANT = 9


class PushError(ValueError):
    pass


@dataclass(frozen=True)
class PushField:
    name: str
    offset: int
    fmt: str   # struct format of one 32-bit scalar: "I" uint, "i" int, "f" float


@dataclass(frozen=True)
class PushLayout:
    kernel: str
    fields: tuple[PushField, ...]

    def pack(self, values: dict) -> bytes:
        """The block's bytes from {member name: value}; every member must be given, and no other."""
        names = {f.name for f in self.fields}
        missing, unknown = names - values.keys(), values.keys() - names
        if missing or unknown:
            raise PushError(f"{self.kernel}: push constants missing {sorted(missing)}, unknown {sorted(unknown)}"
                            f" (the block has {[f.name for f in self.fields]})")
        data = bytearray(max((f.offset + 4 for f in self.fields), default=0))
        for f in self.fields:
            try:
                struct.pack_into("<" + f.fmt, data, f.offset, values[f.name])
            except struct.error as e:
                raise PushError(f"{self.kernel}: push constant {f.name} = {values[f.name]!r}: {e}") from None
        return bytes(data)


def _string(words) -> str:
    raw = struct.pack(f"<{len(words)}I", *words)
    return raw[:raw.index(0)].decode()


def _push_block(kernel: str, spirv: bytes) -> list[tuple[str | None, int, str]]:
    """(name or None where stripped, offset, format) of each member of the push-constant block."""
    words = struct.unpack(f"<{len(spirv) // 4}I", spirv)
    if words[0] != MAGIC:
        raise PushError(f"{kernel}: not SPIR-V")
    member_names, offsets, scalars, structs, pointers, block = {}, {}, {}, {}, {}, None
    i = 5
    while i < len(words):
        count, op = words[i] >> 16, words[i] & 0xFFFF
        args = words[i + 1:i + count]
        if op == OP_MEMBER_NAME:
            member_names[args[0], args[1]] = _string(args[2:])
        elif op == OP_MEMBER_DECORATE and args[2] == DECORATION_OFFSET:
            offsets[args[0], args[1]] = args[3]
        elif op == OP_TYPE_INT and args[1] == 32:
            scalars[args[0]] = "i" if args[2] else "I"
        elif op == OP_TYPE_FLOAT and args[1] == 32:
            scalars[args[0]] = "f"
        elif op == OP_TYPE_STRUCT:
            structs[args[0]] = args[1:]
        elif op == OP_TYPE_POINTER:
            pointers[args[0]] = args[2]
        elif op == OP_VARIABLE and args[2] == STORAGE_PUSH_CONSTANT:
            block = pointers[args[0]]
        i += count
    if block is None:
        return []
    members = []
    for m, type_id in enumerate(structs[block]):
        if type_id not in scalars:
            raise PushError(f"{kernel}: push constant member {m} is not a 32-bit scalar")
        members.append((member_names.get((block, m)), offsets[block, m], scalars[type_id]))
    return members


def push_layout(kernel: str, spirv: bytes, named_spirv: bytes) -> PushLayout:
    """The push-constant block of kernel `spirv` (no fields when it has none), named from
    `named_spirv`, a build of the same source that kept its debug names."""
    named, used = _push_block(kernel, named_spirv), _push_block(kernel, spirv)
    if [m[1:] for m in named] != [m[1:] for m in used] or any(m[0] is None for m in named):
        raise PushError(f"{kernel}: the named build's push constants {named} differ from the kernel's {used}")
    return PushLayout(kernel, tuple(PushField(*m) for m in named))
