"""Runtime shader build: glslc errors, the disk cache and its key, packaged SPIR-V, missing glslc."""

import shutil
from pathlib import Path

import pytest

from ssm_vk import runtime as rt
from ssm_vk.runtime import shaders
from ssm_vk.runtime.spirv import SPIRV_MAGIC
from ssm_vk.runtime.spirv_cache import ENTRY_MAGIC

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
    runs, hits = _runs(), shaders.stats.disk_hits
    spirv = rt.compile_shader("saxpy", {"OFFSET": 0.5}, search_path=glsl_dir)
    assert spirv[:4] == SPIRV_MAGIC and _runs() == runs + 1 and shaders.stats.disk_hits == hits
    again = rt.compile_shader("saxpy", {"OFFSET": 0.5}, search_path=glsl_dir)
    # served from the disk cache: read from the entry glslc's run stored, glslc not run again
    assert again == spirv and _runs() == runs + 1 and shaders.stats.disk_hits == hits + 1
    assert len(list(spirv_cache.glob("saxpy-*/*.entry"))) == 1


def _entry_of(spirv_cache, glsl_dir, defines=None):
    spirv = rt.compile_shader("saxpy", defines, search_path=glsl_dir)
    (entry,) = shaders.cache_folder("saxpy", defines, search_path=glsl_dir).glob("*.entry")
    return spirv, entry


def _damage(kind: str, data: bytes, other: bytes) -> bytes:
    """A cache entry's bytes damaged the ways a disk, a copy or a person damage files."""
    if kind == "truncated":            # a full disk; keeps a multiple of 4 bytes of SPIR-V
        return data[:len(data) - 8]
    if kind == "bit-flipped":          # one bit of the SPIR-V body
        i = len(data) - 40
        return data[:i] + bytes([data[i] ^ 0x10]) + data[i + 1:]
    if kind == "zero-length":
        return b""
    if kind == "swapped":              # another variant's intact entry in this one's place
        return other
    if kind == "bare-spirv":           # a plain .spv of an older cache layout, renamed
        return data[data.index(b"\n", len(ENTRY_MAGIC)) + 1:]
    raise AssertionError(kind)


KINDS = ("truncated", "bit-flipped", "zero-length", "swapped", "bare-spirv")


@pytest.mark.parametrize("kind", KINDS)
def test_a_damaged_cache_entry_is_rebuilt_not_loaded(glslc, spirv_cache, glsl_dir, kind, caplog):
    spirv, entry = _entry_of(spirv_cache, glsl_dir)
    other_spirv, other = _entry_of(spirv_cache, glsl_dir, {"OFFSET": 3.0})
    assert other_spirv != spirv
    entry.write_bytes(_damage(kind, entry.read_bytes(), other.read_bytes()))
    runs = _runs()
    with caplog.at_level("WARNING", logger="ssm_vk"):
        assert rt.compile_shader("saxpy", search_path=glsl_dir) == spirv
    assert _runs() == runs + 1                          # rebuilt by glslc
    assert any(str(entry) in r.getMessage() and "damaged" in r.getMessage() for r in caplog.records)
    assert rt.compile_shader("saxpy", search_path=glsl_dir) == spirv and _runs() == runs + 1  # and stored again
    assert rt.compile_shader("saxpy", {"OFFSET": 3.0}, search_path=glsl_dir) == other_spirv


@pytest.mark.parametrize("kind", KINDS)
def test_without_glslc_a_damaged_entry_is_refused_with_the_file_named(glslc, spirv_cache, glsl_dir, kind,
                                                                       monkeypatch, tmp_path):
    _, entry = _entry_of(spirv_cache, glsl_dir)
    _, other = _entry_of(spirv_cache, glsl_dir, {"OFFSET": 3.0})
    entry.write_bytes(_damage(kind, entry.read_bytes(), other.read_bytes()))
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    why = shaders.unavailable("saxpy", search_path=glsl_dir)
    assert "glslc is not on PATH" in why and str(entry) in why
    with pytest.raises(rt.GlslcMissing, match="glslc is not on PATH"):
        rt.compile_shader("saxpy", search_path=glsl_dir)


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
    assert not list(spirv_cache.glob("**/*.entry"))  # nothing cached from a failed build


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


@pytest.mark.parametrize("kind", ("truncated", "bit-flipped", "zero-length", "swapped"))
def test_a_damaged_packaged_file_is_never_loaded(glslc, spirv_cache, glsl_dir, tmp_path, monkeypatch, kind, caplog):
    package = tmp_path / "spirv"
    one, two = shaders.build_all([("saxpy", None), ("saxpy", {"OFFSET": 2.0})], package, search_path=glsl_dir)
    good = one.read_bytes()
    if kind == "swapped":
        data = two.read_bytes()
        two.write_bytes(good)
        one.write_bytes(data)
    else:
        one.write_bytes(_damage(kind, good, b""))  # the SPIR-V still starts with its magic number
    monkeypatch.setattr(shaders, "PACKAGED_SPIRV", package)
    monkeypatch.setenv("SSM_SCAN_CACHE", str(tmp_path / "other-cache"))
    with caplog.at_level("WARNING", logger="ssm_vk"):
        assert rt.compile_shader("saxpy", search_path=glsl_dir) == good         # glslc rebuilds it
    assert any(str(one) in r.getMessage() for r in caplog.records)
    monkeypatch.setenv("SSM_SCAN_CACHE", str(tmp_path / "third-cache"))
    monkeypatch.setenv("PATH", str(tmp_path))                                   # no glslc
    why = shaders.unavailable("saxpy", search_path=glsl_dir)
    assert "glslc is not on PATH" in why and str(one) in why
    with pytest.raises(FileNotFoundError, match="intact packaged"):            # as in a wheel without sources
        rt.compile_shader("saxpy", search_path=tmp_path / "nowhere")


def test_unavailable_is_the_calls_own_answer(glslc, spirv_cache, glsl_dir, tmp_path):
    # glslc on PATH is not enough: there must be a source to compile, and glslc must accept it.
    assert shaders.unavailable("saxpy", search_path=glsl_dir) == ""
    why = shaders.unavailable("saxpy", search_path=tmp_path / "nowhere")
    assert "saxpy.comp not found" in why
    (tmp_path / "broken.comp").write_text("#version 450\nvoid main() { undeclared_thing = 1; }\n")
    why = shaders.unavailable("broken", search_path=tmp_path)
    assert "glslc failed" in why and "undeclared_thing" in why


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
