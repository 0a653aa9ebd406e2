"""SPIR-V inspection: what a compiled module asks of the device, read from its words -- the
workgroup size it really uses, and the bytes of workgroup (shared) memory it declares -- so that
limits are checked before a pipeline is made; and whether bytes are a whole module at all."""

from __future__ import annotations

import struct

__all__ = ["SPIRV_MAGIC", "check_workgroup_size", "module_problem", "workgroup_memory_bytes"]

SPIRV_MAGIC = b"\x03\x02\x23\x07"

_OP_DECORATE, _OP_EXECUTION_MODE = 71, 16
_OP_CONSTANT, _OP_SPEC_CONSTANT, _OP_CONSTANT_COMPOSITE, _OP_SPEC_CONSTANT_COMPOSITE = 43, 50, 44, 51
_DECORATION_BUILTIN, _DECORATION_SPEC_ID, _BUILTIN_WORKGROUP_SIZE, _MODE_LOCAL_SIZE = 11, 1, 25, 17


def module_problem(data: bytes) -> str:
    """Why ``data`` is not a whole SPIR-V module (no magic number, not whole words, shorter than
    the header), or "" (the loaders' first check: a packaged file, a cache entry, glslc's output)."""
    if not data.startswith(SPIRV_MAGIC):
        return "no SPIR-V magic number"
    if len(data) % 4 or len(data) < 20:
        return f"{len(data)} bytes: no whole SPIR-V module"
    return ""


def check_workgroup_size(spirv: bytes, local_size: tuple[int, int, int], name: str = "shader") -> None:
    """Raise ValueError unless the module's workgroup size is ``local_size`` once specialised:
    each dimension must be a specialisation constant with SpecId 0/1/2, or fixed to that value."""
    if len(spirv) % 4 or len(spirv) < 20:
        raise ValueError(f"{name}: not a SPIR-V module")
    words = struct.unpack(f"<{len(spirv) // 4}I", spirv)
    literal_size, builtin_id, spec_ids, constants, composites = None, None, {}, {}, {}
    i = 5
    while i < len(words):
        count, op = words[i] >> 16, words[i] & 0xFFFF
        if count == 0:
            raise ValueError(f"{name}: malformed SPIR-V")
        args = words[i + 1:i + count]
        if op == _OP_EXECUTION_MODE and args[1] == _MODE_LOCAL_SIZE:
            literal_size = tuple(args[2:5])
        elif op == _OP_DECORATE and args[1] == _DECORATION_BUILTIN and args[2] == _BUILTIN_WORKGROUP_SIZE:
            builtin_id = args[0]
        elif op == _OP_DECORATE and args[1] == _DECORATION_SPEC_ID:
            spec_ids[args[0]] = args[2]
        elif op in (_OP_CONSTANT, _OP_SPEC_CONSTANT):
            constants[args[1]] = (op, args[2])
        elif op in (_OP_CONSTANT_COMPOSITE, _OP_SPEC_CONSTANT_COMPOSITE):
            composites[args[1]] = args[2:]
        i += count
    if builtin_id is None:
        fixed = literal_size or local_size
    else:  # WorkgroupSize overrides LocalSize; its parts are constants or specialisation constants
        fixed = []
        for dim, part in enumerate(composites.get(builtin_id, ())):
            op, value = constants.get(part, (None, None))
            if op == _OP_SPEC_CONSTANT and spec_ids.get(part) == dim:
                fixed.append(local_size[dim])  # ours to set
            elif op == _OP_CONSTANT:
                fixed.append(value)
            else:
                raise ValueError(f"{name}: workgroup size dimension {dim} is neither a constant nor "
                                 f"specialisation constant {dim}; declare local_size_{'xyz'[dim]}_id = {dim}")
    if tuple(fixed) != local_size:
        raise ValueError(f"{name}: the shader fixes local_size {tuple(fixed)}, not {local_size}; declare "
                         "layout(local_size_x_id = 0, local_size_y_id = 1, local_size_z_id = 2) in;")


_OP_TYPE_INT, _OP_TYPE_FLOAT, _OP_TYPE_VECTOR, _OP_TYPE_MATRIX = 21, 22, 23, 24
_OP_TYPE_ARRAY, _OP_TYPE_STRUCT, _OP_TYPE_POINTER, _OP_VARIABLE = 28, 30, 32, 59
_STORAGE_WORKGROUP = 4


def workgroup_memory_bytes(spirv: bytes) -> int:
    """Bytes of the Workgroup-storage (GLSL ``shared``) variables a module declares: scalars,
    vectors, matrices, arrays of constant length and structs, packed (drivers may pad a little;
    a limit is compared with this as the least they need). Raises ValueError for a malformed
    module or an array whose length is not a plain constant."""
    if len(spirv) % 4 or len(spirv) < 20:
        raise ValueError("not a SPIR-V module")
    words = struct.unpack(f"<{len(spirv) // 4}I", spirv)
    sizes: dict[int, int] = {}           # type id -> bytes
    pointers: dict[int, tuple] = {}      # pointer type id -> (storage class, pointee type)
    constants: dict[int, int] = {}
    variables: list[int] = []            # pointer types of Workgroup variables
    i = 5
    while i < len(words):
        count, op = words[i] >> 16, words[i] & 0xFFFF
        if count == 0:
            raise ValueError("malformed SPIR-V")
        a = words[i + 1:i + count]
        if op in (_OP_TYPE_INT, _OP_TYPE_FLOAT):
            sizes[a[0]] = a[1] // 8
        elif op in (_OP_TYPE_VECTOR, _OP_TYPE_MATRIX):
            sizes[a[0]] = sizes.get(a[1], 0) * a[2]
        elif op == _OP_CONSTANT:
            constants[a[1]] = a[2]
        elif op == _OP_TYPE_ARRAY:
            if a[2] not in constants:
                raise ValueError("a shared array whose length is not a plain constant")
            sizes[a[0]] = sizes.get(a[1], 0) * constants[a[2]]
        elif op == _OP_TYPE_STRUCT:
            sizes[a[0]] = sum(sizes.get(m, 0) for m in a[1:])
        elif op == _OP_TYPE_POINTER:
            pointers[a[0]] = (a[1], a[2])
        elif op == _OP_VARIABLE and a[2] == _STORAGE_WORKGROUP:
            variables.append(a[0])
        i += count
    return sum(sizes.get(pointers[v][1], 0) for v in variables if v in pointers)
