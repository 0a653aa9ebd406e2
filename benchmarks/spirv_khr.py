"""SPIR-V of VK_NV_cooperative_matrix rewritten for VK_KHR_cooperative_matrix, the portable
extension (NVIDIA, AMD RDNA3 and later, Intel Arc), so that shaders written with
GL_NV_cooperative_matrix -- which Debian 12's glslc (shaderc 2023.2) compiles, where it does not
know GL_KHR_cooperative_matrix -- run on devices that offer only the KHR extension. For the
matrix-units probe (vk_split_probe.py); not a product path yet.

What differs between the two (SPV_NV_cooperative_matrix, SPV_KHR_cooperative_matrix):

- a KHR matrix type names its use (the left operand A, the right one B, or the accumulator) where
  an NV type does not: each NV type is rewritten in place with the use it has in the module's
  multiply-adds; a type that serves as both A and B (the same shape and component type) is split,
  each load of it taking the type of the operand its result feeds -- which is why a value of such
  a type may only be loaded and multiplied (ValueError otherwise);
- loads and stores name a memory layout (a constant: 0 row-major, 1 column-major) before the
  stride, where NV's take the stride and then a boolean "column major" (a constant here);
- the opcodes, the capability and the extension's name.

    rewrite(spirv: bytes) -> bytes      (unchanged when the module has no NV matrix)
"""

from __future__ import annotations

import struct

__all__ = ["rewrite"]

_CAP, _EXT = 17, 10
_CAP_NV, _CAP_KHR = 5357, 6022
_TYPE_NV, _LOAD_NV, _STORE_NV, _MULADD_NV, _LENGTH_NV = 5358, 5359, 5360, 5361, 5362
_TYPE_KHR, _LOAD_KHR, _STORE_KHR, _MULADD_KHR, _LENGTH_KHR = 4456, 4457, 4458, 4459, 4460
_CONST_TRUE, _CONST_FALSE, _CONSTANT, _FUNCTION = 41, 42, 43, 54
_TYPE_POINTER, _VARIABLE, _LOAD, _STORE = 32, 59, 61, 62
_USE_A, _USE_B, _USE_ACC = 0, 1, 2


def _words(spirv: bytes) -> list[int]:
    if len(spirv) % 4 or len(spirv) < 20 or spirv[:4] != b"\x03\x02\x23\x07":
        raise ValueError("spirv: not a little-endian SPIR-V module")
    return list(struct.unpack(f"<{len(spirv) // 4}I", spirv))


def _instructions(words: list[int]) -> list[list[int]]:
    out, i = [], 5
    while i < len(words):
        n = words[i] >> 16
        if n == 0 or i + n > len(words):
            raise ValueError(f"spirv: a malformed instruction at word {i}")
        out.append(words[i:i + n])
        i += n
    return out


def _string(s: str) -> list[int]:
    b = s.encode() + b"\0"
    b += b"\0" * (-len(b) % 4)
    return list(struct.unpack(f"<{len(b) // 4}I", b))


def _op(opcode: int, operands: list[int]) -> list[int]:
    return [(len(operands) + 1) << 16 | opcode, *operands]


def rewrite(spirv: bytes) -> bytes:
    """The module with every NV cooperative-matrix type, instruction, capability and extension
    replaced by the KHR one (module docstring). Raises ValueError for a module that is not SPIR-V
    or uses an NV matrix in a way this rewrite does not map (a layout that is not a constant, a
    type both A and B whose values do more than load and multiply)."""
    words = _words(spirv)
    ins = _instructions(words)
    nv_types = {w[1] for w in ins if w[0] & 0xFFFF == _TYPE_NV}
    if not nv_types:
        return spirv
    bound = words[3]
    # the type of every value a function computes (inside functions an instruction whose first
    # operand is a type has that type and its second operand is its result), and the constants
    types = {w[1] for w in ins if 19 <= w[0] & 0xFFFF <= 39 or w[0] & 0xFFFF in (_TYPE_NV, _TYPE_KHR)}
    value_type, consts, bools, defined_by = {}, {}, {}, {}
    in_function = False
    for w in ins:
        op = w[0] & 0xFFFF
        in_function = in_function or op == _FUNCTION
        if op == _CONSTANT and len(w) == 4:
            consts[w[2]] = (w[1], w[3])
        elif op in (_CONST_TRUE, _CONST_FALSE):
            bools[w[2]] = op == _CONST_TRUE
        if in_function and len(w) > 2 and w[1] in types:
            value_type[w[2]] = w[1]
            defined_by[w[2]] = w
    # the uses each NV type has in the multiply-adds, and which operand each value feeds
    roles: dict[int, set] = {t: set() for t in nv_types}
    feeds: dict[int, set] = {}
    for w in ins:
        if w[0] & 0xFFFF == _MULADD_NV:
            rtype, _, a, b, c = w[1:6]
            roles[rtype].add(_USE_ACC)
            for v, use in ((a, _USE_A), (b, _USE_B), (c, _USE_ACC)):
                roles[value_type[v]].add(use)
                feeds.setdefault(v, set()).add(use)
    # an int constant of each value the uses and layouts name (of the type of the matrices' row
    # counts), defined before the first matrix type: made where missing, moved up where defined later
    first_type = next(i for i, w in enumerate(ins) if w[0] & 0xFFFF == _TYPE_NV)
    int_type = consts[ins[first_type][4]][0]
    new_consts: list[list[int]] = []
    moved: set[int] = set()
    at = {w[2]: i for i, w in enumerate(ins) if w[0] & 0xFFFF == _CONSTANT}
    small = {}
    for value in (0, 1, 2):
        cid = next((c for c, (t, v) in consts.items() if t == int_type and v == value), None)
        if cid is None:
            cid, bound = bound, bound + 1
            consts[cid] = (int_type, value)
        elif at[cid] < first_type:
            small[value] = cid
            continue
        else:
            moved.add(cid)
        new_consts.append(_op(_CONSTANT, [int_type, cid, value]))
        small[value] = cid

    def const(value: int) -> int:
        return small[value]
    # each NV type's KHR form; a type used as A and as B gets a second type for B, and the loads
    # of its values take the type of the operand they feed
    split_b: dict[int, int] = {}
    for w in ins:
        if w[0] & 0xFFFF != _TYPE_NV:
            continue
        tid, comp, scope, rows, cols = w[1:6]
        uses = roles[tid] or {_USE_ACC}
        if uses == {_USE_A, _USE_B}:
            split_b[tid] = bound
            bound += 1
        elif len(uses) > 1:
            raise ValueError(f"spirv: matrix type %{tid} is used as {sorted(uses)} (A 0, B 1, accumulator 2): "
                             "give each use a type of its own")
    retyped, pointers = _split_values(ins, split_b, feeds, value_type)
    for ptype, t in list(pointers.items()):   # the B twin of each pointer type the B variables take
        pointers[ptype] = (t, bound)
        bound += 1
    for v, t in list(retyped.items()):
        if t in pointers:
            retyped[v] = pointers[t][1]
    out: list[list[int]] = []
    placed = False
    for w in ins:
        op = w[0] & 0xFFFF
        if op == _CONSTANT and w[2] in moved:
            continue
        if op == _CAP and w[1] == _CAP_NV:
            out.append(_op(_CAP, [_CAP_KHR]))
        elif op == _EXT and w[1:] == _string("SPV_NV_cooperative_matrix"):
            out.append(_op(_EXT, _string("SPV_KHR_cooperative_matrix")))
        elif op == _TYPE_NV:
            tid, comp, scope, rows, cols = w[1:6]
            uses = roles[tid] or {_USE_ACC}
            first = _USE_A if tid in split_b else next(iter(uses))
            khr = [_op(_TYPE_KHR, [tid, comp, scope, rows, cols, const(first)])]
            if tid in split_b:
                khr.append(_op(_TYPE_KHR, [split_b[tid], comp, scope, rows, cols, const(_USE_B)]))
            if not placed:   # the constants the types and layouts name, just before the first type
                out.extend(new_consts)
                placed = True
            out.extend(khr)
        elif op == _TYPE_POINTER and w[1] in pointers:
            out.append(w)
            t, twin = pointers[w[1]]
            out.append(_op(_TYPE_POINTER, [twin, w[2], split_b[t]]))
        elif op in (_LOAD, _VARIABLE) and w[2] in retyped:
            out.append(_op(op, [retyped[w[2]], *w[2:]]))
        elif op == _LOAD_NV:
            rtype, rid, ptr, stride, colmajor, *mem = w[1:]
            out.append(_op(_LOAD_KHR, [retyped.get(rid, rtype), rid, ptr, _layout(colmajor, bools, const), stride,
                                       *mem]))
        elif op == _STORE_NV:
            ptr, obj, stride, colmajor, *mem = w[1:]
            out.append(_op(_STORE_KHR, [ptr, obj, _layout(colmajor, bools, const), stride, *mem]))
        elif op == _MULADD_NV:
            out.append(_op(_MULADD_KHR, w[1:6]))
        elif op == _LENGTH_NV:
            out.append(_op(_LENGTH_KHR, w[1:]))
        else:
            out.append(w)
    header = [*words[:3], bound, words[4]]
    flat = header + [x for w in out for x in w]
    return struct.pack(f"<{len(flat)}I", *flat)


def _split_values(ins, split_b: dict, feeds: dict, value_type: dict) -> tuple[dict, dict]:
    """({id: its B type or B pointer type} of the values and variables of a type both A and B that
    hold a B operand, {pointer type: matrix type} of the pointer types such variables have).

    glslc passes a loaded matrix through a function variable (OpStore, then OpLoad before the
    multiply-add): a variable's use is that of the values loaded from it, a stored value's that of
    its variable, a loaded value's that of the operand it feeds. Anything else a value of such a
    type does (a phi, a copy, an argument) is refused."""
    var_type, loads_from, stored_in = {}, {}, {}
    for w in ins:
        op = w[0] & 0xFFFF
        if op == _VARIABLE:
            var_type[w[2]] = w[1]
        elif op == _LOAD:
            loads_from[w[2]] = w[3]
        elif op == _STORE:
            stored_in.setdefault(w[2], []).append(w[1])
    ptr_target = {w[1]: w[3] for w in ins if w[0] & 0xFFFF == _TYPE_POINTER}
    split_vars = {v for v, p in var_type.items() if ptr_target.get(p) in split_b}
    use: dict[int, set] = {v: set(u) for v, u in feeds.items() if value_type.get(v) in split_b}
    for _ in range(4):   # (load -> product, store -> variable -> load: a fixed point in a few rounds)
        for v, var in loads_from.items():
            if var in split_vars and v in use:
                use.setdefault(var, set()).update(use[v])
        for v, targets in stored_in.items():
            for var in targets:
                if var in use:
                    use.setdefault(v, set()).update(use[var])
    retyped, pointers = {}, {}
    for v, t in value_type.items():
        if t not in split_b:
            continue
        u = use.get(v, set())
        if len(u) != 1:
            raise ValueError(f"spirv: %{v} of matrix type %{t} (both A and B) feeds {sorted(u) or 'no product'}: "
                             "it must feed the A or the B operand of products, through loads and variables only")
        if u == {_USE_B}:
            retyped[v] = split_b[t]
    for var in split_vars:
        u = use.get(var, set())
        if len(u) != 1:
            raise ValueError(f"spirv: variable %{var} of a matrix type both A and B holds {sorted(u) or 'no'} "
                             "operands: one kind only")
        if u == {_USE_B}:
            pointers[var_type[var]] = ptr_target[var_type[var]]
            retyped[var] = var_type[var]   # (its B twin once the pointer types are made)
    return retyped, pointers


def _layout(colmajor: int, bools: dict, const) -> int:
    if colmajor not in bools:
        raise ValueError(f"spirv: the column-major operand %{colmajor} of a load or store is not a constant")
    return const(1 if bools[colmajor] else 0)
