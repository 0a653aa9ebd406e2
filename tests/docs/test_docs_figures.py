"""Figures the docs quote that the code determines: each is read from its page and compared with
what the code computes now, so a change to the code that moves a figure fails here until the page
says the new one."""

from __future__ import annotations

import re

from children import REPO


def _h100():
    """An H100's limits as NVIDIA's driver 580 reports them (4 GiB bindings and allocations)."""
    from ssm_vk.sizing import Limits

    return Limits(subgroup_size=32, subgroup_ops=frozenset({"basic", "arithmetic", "shuffle"}),
                  max_workgroup_invocations=1024, max_shared_memory=48 << 10,
                  max_workgroup_count=(2**31 - 1, 65535, 65535), max_storage_buffer_range=2**32 - 1,
                  max_memory_allocation_size=4292870144, min_storage_buffer_offset_alignment=16,
                  max_workgroup_size=(1024, 1024, 64), max_push_constants_size=256,
                  max_storage_buffers_per_stage=2**20, device_type="discrete", device_local_bytes=80 << 30)


def _quoted(page: str, pattern: str) -> int:
    """The integer the single match of ``pattern`` (one group, digits and commas) finds on ``page``."""
    text = (REPO / page).read_text()
    found = re.findall(pattern, text)
    assert len(found) == 1, f"{page}: expected one match of {pattern!r}, found {len(found)}"
    return int(found[0].replace(",", ""))


def test_install_quotes_the_packaged_variant_count():
    # make dist builds the matrix for the GPU profiles (subgroup 8-64) plus the local device's;
    # the page quotes the part that does not depend on the building machine.
    from ssm_cli import build

    profiles = [lim for _, lim in build.profiles("8,16,32,64")]
    p_values = tuple(build.common.int_list(build.DEFAULT_P, "--p", minimum=1))
    n_values = build.n_list(build.DEFAULT_N, "--n")
    chunked_n = build.n_list(build.DEFAULT_CHUNKED_N, "--chunked-n")
    count = len(build.variants(profiles, n_values, p_values, chunked_n))
    quoted = _quoted("docs/INSTALL.md", r"`ssm_vk/spirv/`: ([\d,]+) variants for the GPU profiles")
    assert quoted == count, f"docs/INSTALL.md quotes {quoted} packaged variants; the matrix has {count}"



def test_the_docs_quote_ssm_fasts_first_compile_time():
    # One figure for the first compile of ssm_fast's kernels: the constant its stderr note prints,
    # measured in docs/FAST.md ("Compile cost"); every page that gives that time quotes the same one.
    from ssm_fast.compiling import FIRST_COMPILE_S

    measured = float(_quoted_text("docs/FAST.md", r"\| total \| ([\d.]+) "))
    assert round(measured) == FIRST_COMPILE_S, f"docs/FAST.md measured {measured} s; ssm_fast says {FIRST_COMPILE_S}"
    for page in ("README.md", "docs/FAST.md", "docs/TORCH.md"):
        quoted = {int(v) for v in re.findall(r"first use,? \(?about (\d+) s", (REPO / page).read_text())}
        assert quoted == {FIRST_COMPILE_S}, f"{page} quotes {sorted(quoted)} s for ssm_fast's first compile"


def _quoted_text(page: str, pattern: str) -> str:
    found = re.findall(pattern, (REPO / page).read_text())
    assert len(found) == 1, f"{page}: expected one match of {pattern!r}, found {len(found)}"
    return found[0]


def test_benchmarks_quotes_the_h200_fma_peak_bench_uses():
    # ssm-scan bench's float32 floor on an H200 divides by this peak; the page quotes the same one.
    from ssm_cli.machine import MEASURED_GPU_PEAKS

    text = (REPO / "docs/BENCHMARKS.md").read_text()
    found = re.findall(r"Float32 FMA peak measured through that\s+stack ([\d.]+) TFLOP/s", text)
    assert found == [f"{MEASURED_GPU_PEAKS['H200'][0] / 1e12:.1f}"], found


def test_api_quotes_the_chunked_token_window_of_a_long_sequence():
    # API.md's long-sequence paragraph: the chunked kernels' token window at H = 64, P = 64,
    # N = 128 under NVIDIA's limits (4 GiB bindings and allocations), forward and backward alike
    from ssm_ref import Dims
    from ssm_vk.chunked.chunked_planner import chunk_plan

    d = Dims(S=1, T=2**20, H=64, P=64, N=128, G=1, R=1, mamba1=False, a_shape=(64,))
    plans = [chunk_plan(d, _h100(), backward) for backward in (False, True)]
    assert all(p is not None and p.tokens for p in plans)
    assert plans[0].Tw == plans[1].Tw == _quoted("docs/API.md", r"of whole chunks \(([\d,]+) tokens at that shape\)")


def _m3_takes(d, backward: bool):
    """(the plan the support decision makes for a Mamba-3 call of dims ``d`` under an H100's limits
    -- registry.plan, the budget on an 80 GiB heap: mamba3_memory.memory --, the cuts of its arrays
    in pieces), or None where the device would not take it."""
    from types import SimpleNamespace

    from ssm_vk import mamba3_memory, registry
    from ssm_vk.config import settings
    from ssm_vk.sizing import TooLarge

    h100 = _h100()
    info = SimpleNamespace(name="H100", max_memory_allocation_size=h100.max_memory_allocation_size,
                           min_storage_buffer_offset_alignment=h100.min_storage_buffer_offset_alignment,
                           device_local_bytes=h100.device_local_bytes, max_memory_allocation_count=4096)
    try:
        fp = registry.plan(d, h100, backward, settings(), op="mamba3_scan")
    except TooLarge:
        return None
    cuts, why = mamba3_memory.memory(d, backward, fp, h100, info)
    return None if why else (fp, cuts)


def _most(takes, top: int) -> int:
    """The largest n below ``top`` that ``takes`` (true up to it, false beyond)."""
    lo, hi = 0, top
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if takes(mid) else (lo, mid)
    return lo


def test_reliability_quotes_the_largest_mamba3_batches_and_their_windows():
    # RELIABILITY.md's known gap: the most sequences of 2048 tokens a Mamba-3 call (H = 32, P = 64,
    # N = 128, F = 32, SISO) takes on the device under an H100's limits (the plan and the memory
    # budget the support decision applies), on the chunked kernels, forward and backward; from
    # how many sequences the chunked kernels run in windows, and from how many the arrays are held
    # in pieces; and where the token-sequential backward (the recompute) stops fitting
    from ssm_ref.mamba3_checks import M3Dims
    from ssm_vk.config import settings
    from ssm_vk.family import Request
    from ssm_vk.mamba3.mamba3_planner import plan_call
    from ssm_vk.sizing import TooLarge

    def dims(S: int) -> M3Dims:
        return M3Dims(S, 2048, 32, 64, 128, 1, 1, 32, S, False)

    def sequential(S: int) -> bool:
        try:
            plan_call(Request(dims(S), _h100(), True, settings()))
        except TooLarge:
            return False
        return True

    def most(what, backward: bool) -> int:
        def takes(S: int) -> bool:
            got = _m3_takes(dims(S), backward)
            return got is not None and got[0].family.name == "mamba3_chunked" and what(*got)
        return _most(takes, 1 << 13)

    text = (REPO / "docs/RELIABILITY.md").read_text()
    found = re.search(r"a forward of up\s+to (\d+) sequences and a backward of up to (\d+), bound by the device's "
                      r"memory; windows from (\d+)\s+sequences forward and from (\d+) backward, pieces from (\d+) "
                      r"sequences.*?from (\d+) sequences of 2048 tokens the token-sequential\s+backward's work buffer",
                      text, re.S)
    assert found, "docs/RELIABILITY.md: the Mamba-3 batch figures are not where the test reads them"
    quoted = tuple(int(v) for v in found.groups())
    assert quoted[:2] == (most(lambda fp, cuts: True, False), most(lambda fp, cuts: True, True))
    one_window = [most(lambda fp, cuts: not fp.plan.windowed, b) + 1 for b in (False, True)]
    whole = [most(lambda fp, cuts: not cuts, b) + 1 for b in (False, True)]
    assert quoted[2:4] == tuple(one_window) and quoted[4] == whole[0] == whole[1]
    assert quoted[5] == _most(sequential, 1 << 12) + 1


def test_kernels_quotes_the_one_token_kernels_blocks():
    # KERNELS.md's decode step on its own kernel: the rows of one tile at N = 128 and the blocks of
    # a head of P = 64 rows, as the planner makes them
    from ssm_ref.mamba3_checks import M3Dims
    from ssm_vk.config import configure, settings
    from ssm_vk.family import Request
    from ssm_vk.mamba3.mamba3_planner import plan_call, step_rows

    d = M3Dims(S=128, T=1, H=32, P=64, N=128, G=1, M=1, F=32, R=128, mimo=False)
    with configure(tune={"M3_STEP": 1}):
        plan = plan_call(Request(d, _h100(), False, settings()))
    assert plan.step
    rows = _quoted("docs/KERNELS.md", r"`4096 / \(N \+ 1\)` rows: (\d+) at N = 128")
    blocks = _quoted("docs/KERNELS.md", r"spread evenly, so (\d+) blocks of \d+ rows at P = 64")
    per = _quoted("docs/KERNELS.md", r"spread evenly, so \d+ blocks of (\d+) rows at P = 64")
    assert (rows, blocks, per) == (step_rows(d), plan.npb, -(-d.P // plan.npb))


def test_reliability_quotes_the_longest_mamba3_sequence_on_the_chunked_kernels():
    # RELIABILITY.md's known gap: one sequence at H = 32, P = 64, N = 128, F = 32 under an H100's
    # limits (plan and memory budget) -- the most tokens the chunked forward and backward take,
    # from how many each runs in windows of tokens, and from how many its arrays are in pieces
    from ssm_ref.mamba3_checks import M3Dims

    def most(what, backward: bool) -> int:
        def takes(T: int) -> bool:
            got = _m3_takes(M3Dims(1, T, 32, 64, 128, 1, 1, 32, 1, False), backward)
            return got is not None and got[0].family.name == "mamba3_chunked" and what(*got)
        return _most(takes, 1 << 26)

    text = (REPO / "docs/RELIABILITY.md").read_text()
    found = re.search(r"runs on the chunked kernels up to ([\d,]+) tokens forward and\s+([\d,]+) backward \(in "
                      r"windows of its tokens from ([\d,]+) forward and from ([\d,]+) backward,\s+in pieces from "
                      r"([\d,]+)\)", text)
    assert found, "docs/RELIABILITY.md: the Mamba-3 sequence figures are not where the test reads them"
    quoted = tuple(int(v.replace(",", "")) for v in found.groups())
    assert quoted[:2] == (most(lambda fp, cuts: True, False), most(lambda fp, cuts: True, True))
    assert quoted[2:4] == tuple(most(lambda fp, cuts: not fp.plan.windowed, b) + 1 for b in (False, True))
    assert quoted[4] == most(lambda fp, cuts: not cuts, False) + 1 == most(lambda fp, cuts: not cuts, True) + 1
