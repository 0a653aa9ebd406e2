"""Runtime shader build: glslc errors, the disk cache and its key, packaged SPIR-V, missing glslc."""

import shutil
import time
from pathlib import Path

import pytest

from ssm_vk import runtime as rt
from ssm_vk.runtime import shaders

TEST_GLSL = Path(__file__).resolve().parents[1] / "glsl"  # the test shaders

pytestmark = pytest.mark.vulkan


@pytest.fixture
def glsl_dir(tmp_path):
    """A private copy of tests/glsl, free to edit."""
    d = tmp_path / "glsl"
    shutil.copytree(TEST_GLSL, d)
    return d


def _runs():
    return shaders.stats.glslc_runs


def test_compile_then_disk_cache_hit_needs_no_glslc(glslc, spirv_cache, glsl_dir):
    runs = _runs()
    t0 = time.perf_counter()
    spirv = rt.compile_shader("saxpy", {"OFFSET": 0.5}, search_path=glsl_dir)
    t1 = time.perf_counter()
    assert spirv[:4] == shaders.SPIRV_MAGIC and _runs() == runs + 1
    again = rt.compile_shader("saxpy", {"OFFSET": 0.5}, search_path=glsl_dir)
    t2 = time.perf_counter()
    assert again == spirv and _runs() == runs + 1  # served from the disk cache
    assert len(list(spirv_cache.glob("saxpy-*/*.spv"))) == 1
    assert t2 - t1 < t1 - t0  # a hit is cheaper than glslc (measured: ~0.3 ms vs ~100 ms)


def test_a_damaged_cache_entry_is_rebuilt(glslc, spirv_cache, glsl_dir):
    spirv = rt.compile_shader("saxpy", search_path=glsl_dir)
    (entry,) = spirv_cache.glob("saxpy-*/*.spv")
    entry.write_bytes(spirv[:10])  # truncated, as by a full disk
    runs = _runs()
    assert rt.compile_shader("saxpy", search_path=glsl_dir) == spirv and _runs() == runs + 1
    assert entry.read_bytes() == spirv


def test_cache_key_covers_defines_and_included_files(glslc, spirv_cache, glsl_dir):
    base = rt.compile_shader("saxpy", None, search_path=glsl_dir)
    runs = _runs()
    assert rt.compile_shader("saxpy", {"OFFSET": 1.0}, search_path=glsl_dir) != base
    assert _runs() == runs + 1
    inc = glsl_dir / "test_common.glsl"
    inc.write_text(inc.read_text().replace("a * x + b * y", "b * y + a * x"))
    rt.compile_shader("saxpy", None, search_path=glsl_dir)  # same main file, edited include: rebuilt
    assert _runs() == runs + 2


def test_compile_error_carries_glslc_stderr(glslc, spirv_cache, tmp_path):
    (tmp_path / "broken.comp").write_text("#version 450\nvoid main() { undeclared_thing = 1; }\n")
    with pytest.raises(rt.ShaderBuildError, match="undeclared_thing") as info:
        rt.compile_shader("broken", search_path=tmp_path)
    assert "broken.comp:2" in info.value.stderr and "error" in info.value.stderr
    assert not list(spirv_cache.glob("**/*.spv"))  # nothing cached from a failed build


def test_glslc_missing(glslc, spirv_cache, glsl_dir, monkeypatch, tmp_path):
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    with pytest.raises(rt.GlslcMissing, match="glslc is not on PATH"):
        rt.compile_shader("saxpy", search_path=glsl_dir)
    monkeypatch.undo()
    monkeypatch.setenv("SSM_SCAN_CACHE", str(spirv_cache))
    built = rt.compile_shader("saxpy", search_path=glsl_dir)
    monkeypatch.setenv("PATH", str(empty))
    assert rt.compile_shader("saxpy", search_path=glsl_dir) == built  # any compiler's cached build serves


def test_packaged_spirv_needs_no_glslc_and_yields_to_edited_sources(glslc, spirv_cache, glsl_dir, tmp_path,
                                                                      monkeypatch):
    package = tmp_path / "spirv"
    written = shaders.build_all([("saxpy", None), ("saxpy", {"OFFSET": 2.0})], package, search_path=glsl_dir)
    assert len(written) == 2 and (package / "index.json").is_file()
    monkeypatch.setattr(shaders, "PACKAGED_SPIRV", package)
    monkeypatch.setenv("SSM_SCAN_CACHE", str(tmp_path / "other-cache"))  # an empty cache
    monkeypatch.setenv("PATH", str(tmp_path))                            # and no glslc
    hits = shaders.stats.packaged_hits
    assert rt.compile_shader("saxpy", {"OFFSET": 2.0}, search_path=glsl_dir) == written[1].read_bytes()
    assert rt.compile_shader("saxpy", {"OFFSET": 2.0}, search_path=tmp_path / "nowhere") == written[1].read_bytes()
    assert shaders.stats.packaged_hits == hits + 2  # with the same source, and as in a wheel (no source)
    (glsl_dir / "saxpy.comp").write_text((glsl_dir / "saxpy.comp").read_text() + "\n// edited\n")
    with pytest.raises(rt.GlslcMissing):  # the packaged build is stale for the edited source
        rt.compile_shader("saxpy", {"OFFSET": 2.0}, search_path=glsl_dir)


@pytest.mark.parametrize(("defines", "error"), [
    ({"1BAD": 1}, ValueError), ({"A": "two words"}, ValueError), ({"A": float("nan")}, ValueError),
    ({"A": [1]}, ValueError), ([("A", 1)], TypeError),
])
def test_bad_defines(defines, error):
    with pytest.raises(error):
        shaders.normalize_defines(defines)


def test_defines_normalize_idempotently():
    d = shaders.normalize_defines({"B": True, "A": None, "C": 2.5, "D": "x"})
    assert d == (("A", ""), ("B", "1"), ("C", "2.5"), ("D", "x"))
    assert shaders.normalize_defines(dict(d)) == d


def test_missing_shader_and_bad_name(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"nope\.comp"):
        rt.compile_shader("nope", search_path=tmp_path)
    with pytest.raises(ValueError):
        rt.compile_shader("../etc/passwd")
