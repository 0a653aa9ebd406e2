"""benchmarks/spirv_khr.py: SPIR-V of VK_NV_cooperative_matrix rewritten for
VK_KHR_cooperative_matrix. The matrix-units probe's kernels (benchmarks/glsl/probe_*.comp) are
compiled by this machine's glslc and rewritten; the module is read back word by word: no NV
instruction, capability or extension left, each matrix type with the use its values have in the
products (a type both A and B split in two, its loads and variables retyped), each load's and
store's layout the NV column-major flag it replaced, every constant a type names defined before
it. (The SPIR-V validator inside slangpy 0.43.1's glslang library, glslang_validateSPIRV, accepts
these modules; Debian 12's SPIRV-Tools 2023.1 does not know the KHR extension, so no validator
runs here.)"""

from __future__ import annotations

import struct
import sys

import pytest
from children import REPO

sys.path.insert(0, str(REPO / "benchmarks"))
import spirv_khr

from ssm_vk.runtime import shaders

GLSL = REPO / "benchmarks" / "glsl"
NV_OPS = {5358, 5359, 5360, 5361, 5362}


def _ins(spirv: bytes) -> list[list[int]]:
    w = list(struct.unpack(f"<{len(spirv) // 4}I", spirv))
    out, i = [], 5
    while i < len(w):
        n = w[i] >> 16
        assert n, f"a zero-length instruction at word {i}"
        out.append(w[i:i + n])
        i += n
    assert i == len(w)
    return out


def _compiled(name: str, terms: int) -> bytes:
    try:
        return shaders.compile_shader(name, {"WG": 128, "CL": 64, "P": 64, "N": 128, "TERMS": terms},
                                      search_path=[GLSL])
    except shaders.GlslcMissing:
        pytest.skip("glslc is not on PATH")


@pytest.mark.parametrize(("name", "terms"), [("probe_zf", 3), ("probe_zf", 1), ("probe_y", 3)])
def test_the_probe_kernels_become_khr_modules(name, terms):
    nv = _compiled(name, terms)
    khr = spirv_khr.rewrite(nv)
    before, after = _ins(nv), _ins(khr)
    ops = [w[0] & 0xFFFF for w in after]
    assert not NV_OPS & set(ops)
    caps = [w[1] for w in after if w[0] & 0xFFFF == 17]
    assert 6022 in caps and 5357 not in caps
    exts = [struct.pack(f"<{len(w) - 1}I", *w[1:]).rstrip(b"\0") for w in after if w[0] & 0xFFFF == 10]
    assert b"SPV_KHR_cooperative_matrix" in exts and b"SPV_NV_cooperative_matrix" not in exts
    assert struct.unpack("<I", khr[12:16])[0] > max(w[2] for w in after if len(w) > 2 and w[0] & 0xFFFF in (43, 4456))
    const_at = {w[2]: (i, w[3]) for i, w in enumerate(after) if w[0] & 0xFFFF == 43}
    types = {w[1]: (i, w) for i, w in enumerate(after) if w[0] & 0xFFFF == 4456}
    for i, w in types.values():   # the scope, rows, columns and use: constants defined before the type
        for cid in w[3:7]:
            assert const_at[cid][0] < i
    use = {t: const_at[w[6]][1] for t, (_, w) in types.items()}
    value_type = {w[2]: w[1] for w in after if w[0] & 0xFFFF in (4457, 61) and len(w) > 3}
    var_type = {w[2]: w[1] for w in after if w[0] & 0xFFFF == 59}
    pointee = {w[1]: w[3] for w in after if w[0] & 0xFFFF == 32}
    for w in after:   # A, B and the accumulator of every product: of the type of that use
        if w[0] & 0xFFFF == 4459:
            rtype, _, a, b, _c = w[1:6]
            assert use[rtype] == 2
            assert use[value_type[a]] == 0 and use[value_type[b]] == 1, (a, b)
    for w in after:   # a value loaded from a variable has the variable's matrix type
        if w[0] & 0xFFFF == 61 and w[3] in var_type and pointee.get(var_type[w[3]]) in types:
            assert w[1] == pointee[var_type[w[3]]]
    # layouts: the NV loads' and stores' column-major flags, in order (1 column-major, 0 row-major)
    bools = {w[2]: w[0] & 0xFFFF == 41 for w in before if w[0] & 0xFFFF in (41, 42)}
    flags = [bools[w[5]] for w in before if w[0] & 0xFFFF == 5359] + [bools[w[4]] for w in before
                                                                        if w[0] & 0xFFFF == 5360]
    layouts = [const_at[w[4]][1] for w in after if w[0] & 0xFFFF == 4457] + [const_at[w[3]][1] for w in after
                                                                             if w[0] & 0xFFFF == 4458]
    assert layouts == [int(f) for f in flags] and flags
    # nothing else changed: the instructions but the rewritten, moved and added ones are the same
    keep = lambda ins: [w for w in ins if w[0] & 0xFFFF not in (17, 10, 43, 32, 59, 61, *NV_OPS,  # noqa: E731
                                                                  4456, 4457, 4458, 4459)]
    assert keep(before) == keep(after)


def test_a_module_without_nv_matrices_is_left_as_it_is_and_bad_input_is_refused():
    try:
        plain = shaders.compile_shader("probe_split", {"WG": 256, "R": 64, "W": 64, "TOKENS": 1, "WEIGHT": 1},
                                       search_path=[GLSL])
    except shaders.GlslcMissing:
        pytest.skip("glslc is not on PATH")
    assert spirv_khr.rewrite(plain) is plain
    with pytest.raises(ValueError, match="not a little-endian SPIR-V module"):
        spirv_khr.rewrite(b"\x00" * 20)
