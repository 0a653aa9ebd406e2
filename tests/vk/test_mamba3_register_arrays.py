"""The Mamba-3 kernels keep their per-invocation arrays (a tile's accumulators, the decay tables
of a block, the state row of the token-sequential kernels) at indices known when they compile.

An array indexed at run time is a function-local array in the SPIR-V, which most GPU drivers place
in memory instead of registers: every multiply-add of a tile or every state update then reads and
writes memory. glslc leaves a loop rolled when it holds a `continue` or another loop whose trip
count is data-dependent, and the array it indexes with the loop's counter then stays indexed at
run time, with nothing failing and every result the same; only the speed tells. This test reads
the SPIR-V assembly of each kernel of both families (the token-sequential ones at packaged (N, M)
that cover one and several pieces of their state staging, SISO and rank 4: compiling all fifteen
takes minutes) and fails on any access to a function-local array through an index that is not a
constant. No device is needed, only glslc.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from ssm_ref.mamba3_checks import M3Dims
from ssm_vk.mamba3.mamba3_chunked_specs import chunk_spec
from ssm_vk.mamba3.mamba3_specs import PACKAGED, reduce_spec, step_spec
from ssm_vk.runtime.shaders import TARGET_ENV

GLSL = Path(__file__).resolve().parents[2] / "ssm_vk" / "mamba3" / "glsl"
COMMON = GLSL.parents[1] / "glsl"
KERNELS = sorted(p.stem for p in GLSL.glob("*.comp"))
# compiled per (N, M), defines ND and MR: sizes among the packaged ones (the forward's staging at
# the planner's M3_STAGE of 8 and 16, and at N = 128 also the knob's 32)
SIZED = {"mamba3_scan": [(16, 1, 8), (64, 4, 16), (128, 1, 8), (128, 1, 16), (128, 1, 32), (256, 1, 8)],
         "mamba3_scan_back": [(16, 1, 0), (64, 4, 0), (128, 1, 0)],
         "mamba3_step": [(16, 1, 0), (64, 4, 0), (128, 1, 0), (256, 4, 0)]}
assert all(nm[:2] in PACKAGED for sizes in SIZED.values() for nm in sizes)
# the kernels of fixed size, each with the defines of every variant a plan dispatches
FIXED = [(k, {}) for k in KERNELS if k not in SIZED and k not in ("mamba3_reduce", "m3b_chunk")]
FIXED += [("mamba3_reduce", dict(reduce_spec().defines)),
          *(("m3b_chunk", dict(chunk_spec(half).defines)) for half in (1, 2))]


def _assembly(glslc: str, name: str, defines: dict) -> str:
    cmd = [glslc, f"--target-env={TARGET_ENV}", "-O", "-S", "-I", str(GLSL), "-I", str(COMMON),
           *(f"-D{k}={v}" for k, v in defines.items()), str(GLSL / f"{name}.comp"), "-o", "-"]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
    assert run.returncode == 0, run.stderr
    return run.stdout


def run_time_indices(asm: str) -> list[str]:
    """The accesses (assembly lines) to function-local arrays through an index that is not a
    constant."""
    consts = set(re.findall(r"^\s*(%\w+) = OpConstant(?:Composite)? ", asm, re.M))
    arrays = set(re.findall(r"^\s*(%\w+) = OpVariable %_ptr_Function__arr\w* Function", asm, re.M))
    bad = []
    for line in asm.splitlines():
        m = re.match(r"\s*%\w+ = Op(?:InBounds)?AccessChain %\w+ (%\w+)((?: %\w+)+)\s*$", line)
        if m and m.group(1) in arrays and any(i not in consts for i in m.group(2).split()):
            bad.append(line.strip())
    return bad


def test_the_check_finds_an_array_indexed_at_run_time(glslc, tmp_path):
    # the check itself: a loop left rolled by a `continue` indexes its array at run time
    src = tmp_path / "rolled.comp"
    src.write_text("""#version 450
#extension GL_EXT_control_flow_attributes : enable
layout(local_size_x = 64) in;
layout(std430, binding = 0) buffer B { float b[]; };
void main() {
    float acc[4];
    [[unroll]] for (uint u = 0u; u < 4u; ++u) acc[u] = b[gl_LocalInvocationIndex * 4u + u];
    [[unroll]] for (uint u = 0u; u < 4u; ++u) {
        if (b[u] > 0.0) continue;
        b[gl_LocalInvocationIndex + 256u * u] = acc[u];
    }
}
""")
    cmd = [glslc, f"--target-env={TARGET_ENV}", "-O", "-S", str(src), "-o", "-"]
    asm = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=True).stdout
    assert run_time_indices(asm)
    assert not run_time_indices(asm.replace("OpVariable %_ptr_Function__arr", "OpVariable %_ptr_Private__arr"))


@pytest.mark.parametrize(("name", "defines"), FIXED, ids=[f"{k}-{'-'.join(map(str, d.values()))}" for k, d in FIXED])
def test_each_kernel_of_fixed_size_indexes_its_arrays_with_constants(glslc, name, defines):
    assert run_time_indices(_assembly(glslc, name, defines)) == []


@pytest.mark.parametrize(("name", "n", "m", "stage"), [(k, *v) for k, sizes in SIZED.items() for v in sizes])
def test_the_token_sequential_kernels_index_their_arrays_with_constants(glslc, name, n, m, stage):
    defines = {"ND": n, "MR": m, **({"STG_BATCH": stage} if stage else {})}
    if name == "mamba3_step":   # (its tile's size and workgroup as the planner sets them)
        defines = dict(step_spec(M3Dims(S=1, T=1, H=1, P=1, N=n, G=1, M=m, F=0, R=1, mimo=m > 1)).defines)
    assert run_time_indices(_assembly(glslc, name, defines)) == []
