"""Figures the docs quote that the code determines: each is read from its page and compared with
what the code computes now, so a change to the code that moves a figure fails here until the page
says the new one."""

from __future__ import annotations

import re

from children import REPO


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
