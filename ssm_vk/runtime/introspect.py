"""What a driver tells about a compiled kernel, through VK_KHR_pipeline_executable_properties:
its compile statistics (registers per thread, instructions, ... as the driver names them) and its
internal representations (the driver's intermediate or machine code, where it shows them).

Kept only for pipelines created while the context was made with ``SSM_VK_PIPELINE_STATS=1`` on a
device offering the extension (``Context.pipeline_stats``); otherwise each function raises a
RuntimeError that says why. For tuning: which knob setting costs registers (and so workgroups per
SM), and what the loops compile to.
"""

from __future__ import annotations

from . import binding

__all__ = ["capture_flags", "statistics", "representations"]


def capture_flags() -> int:
    """The pipeline-creation flags that keep both."""
    vk = binding.require()
    return (vk.VK_PIPELINE_CREATE_CAPTURE_STATISTICS_BIT_KHR
            | vk.VK_PIPELINE_CREATE_CAPTURE_INTERNAL_REPRESENTATIONS_BIT_KHR)


def _call(kernel, what: str, body):
    """Run ``body(vk, ffi, device, fn, executables)`` under the context's lock, once checked."""
    ctx = kernel.ctx
    if not ctx.pipeline_stats:
        raise RuntimeError(f"kernel {kernel.name}: no {what}: {ctx.pipeline_stats_missing}")
    if kernel.closed:
        raise RuntimeError(f"kernel {kernel.name} is closed")
    vk = binding.require()
    ffi = vk.ffi
    with ctx.lock, binding.translated(f"{what} of kernel {kernel.name}"):
        ctx.check_usable()
        device = ctx.handle

        def fn(name):
            address = vk.lib.vkGetDeviceProcAddr(device, name.encode())
            if address == ffi.NULL:
                raise RuntimeError(f"kernel {kernel.name}: the driver has no {name}")
            return ffi.cast(f"PFN_{name}", address)

        info = ffi.new("VkPipelineInfoKHR*", {"sType": vk.VK_STRUCTURE_TYPE_PIPELINE_INFO_KHR,
                                              "pipeline": kernel.pipeline})
        count = ffi.new("uint32_t*")
        binding.check_result(fn("vkGetPipelineExecutablePropertiesKHR")(device, info, count, ffi.NULL),
                             "vkGetPipelineExecutablePropertiesKHR")
        executables = [ffi.new("VkPipelineExecutableInfoKHR*", {
            "sType": vk.VK_STRUCTURE_TYPE_PIPELINE_EXECUTABLE_INFO_KHR, "pipeline": kernel.pipeline,
            "executableIndex": i}) for i in range(count[0])]
        return body(vk, ffi, device, fn, executables)


def statistics(kernel) -> dict:
    """The driver's compile statistics of ``kernel``'s pipeline: name -> value (int, float or bool;
    what a driver reports varies: NVIDIA's include registers per thread), for each executable the
    driver made (a compute pipeline has one; a second one's names get its index)."""

    def body(vk, ffi, device, fn, executables):
        get = fn("vkGetPipelineExecutableStatisticsKHR")
        out: dict = {}
        for index, exe in enumerate(executables):
            n = ffi.new("uint32_t*")
            binding.check_result(get(device, exe, n, ffi.NULL), "vkGetPipelineExecutableStatisticsKHR")
            items = ffi.new("VkPipelineExecutableStatisticKHR[]", n[0])
            for item in items:
                item.sType = vk.VK_STRUCTURE_TYPE_PIPELINE_EXECUTABLE_STATISTIC_KHR
            binding.check_result(get(device, exe, n, items), "vkGetPipelineExecutableStatisticsKHR")
            for item in items[0:n[0]]:
                fmt = int(item.format)
                if fmt == vk.VK_PIPELINE_EXECUTABLE_STATISTIC_FORMAT_BOOL32_KHR:
                    value = bool(item.value.b32)
                elif fmt == vk.VK_PIPELINE_EXECUTABLE_STATISTIC_FORMAT_INT64_KHR:
                    value = int(item.value.i64)
                elif fmt == vk.VK_PIPELINE_EXECUTABLE_STATISTIC_FORMAT_UINT64_KHR:
                    value = int(item.value.u64)
                else:
                    value = float(item.value.f64)
                name = binding.c_string(item.name)
                out[name if index == 0 else f"{name} [{index}]"] = value
        return out

    return _call(kernel, "compile statistics", body)


def representations(kernel) -> list[tuple[int, str, str, str | bytes]]:
    """The driver's internal representations of ``kernel``'s pipeline: (executable, name,
    description, text -- or bytes where the driver says it is not text), in the driver's order;
    an empty list where the driver keeps none."""

    def body(vk, ffi, device, fn, executables):
        get = fn("vkGetPipelineExecutableInternalRepresentationsKHR")
        what = "vkGetPipelineExecutableInternalRepresentationsKHR"
        out = []
        for index, exe in enumerate(executables):
            n = ffi.new("uint32_t*")
            binding.check_result(get(device, exe, n, ffi.NULL), what)
            items = ffi.new("VkPipelineExecutableInternalRepresentationKHR[]", n[0])
            for item in items:
                item.sType = vk.VK_STRUCTURE_TYPE_PIPELINE_EXECUTABLE_INTERNAL_REPRESENTATION_KHR
            binding.check_result(get(device, exe, n, items), what)          # the sizes
            buffers = [ffi.new("char[]", max(1, int(item.dataSize))) for item in items[0:n[0]]]
            for item, buf in zip(items[0:n[0]], buffers, strict=True):
                item.pData = buf
            binding.check_result(get(device, exe, n, items), what)          # the data
            for item, buf in zip(items[0:n[0]], buffers, strict=True):
                size = int(item.dataSize)
                data = ffi.buffer(buf, size)[:]
                content = data.rstrip(b"\0").decode("utf-8", "replace") if item.isText else data
                out.append((index, binding.c_string(item.name), binding.c_string(item.description), content))
        return out

    return _call(kernel, "internal representations", body)
