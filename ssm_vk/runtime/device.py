"""Physical devices: what they can do (:class:`DeviceInfo`), listing them, and choosing one.

Nothing here creates a logical device. Every property is copied into Python values as soon as it
is read, because a nested cffi struct member does not keep its parent alive (docs/VULKAN.md, the
binding's sharp edge 6: a stale ``props.limits`` read back 0 groups).
"""

from __future__ import annotations

import dataclasses
import functools
import sys
from dataclasses import dataclass

from .. import config
from . import binding
from .binding import VulkanUnavailable

DEVICE_ENV = "SSM_VK_DEVICE"

_TYPE_NAMES = {0: "other", 1: "integrated", 2: "discrete", 3: "virtual", 4: "cpu"}
_TYPE_PREFERENCE = ("discrete", "integrated", "virtual", "cpu", "other")  # the selection order
_SUBGROUP_OPS = {  # VkSubgroupFeatureFlagBits
    0x01: "basic", 0x02: "vote", 0x04: "arithmetic", 0x08: "ballot",
    0x10: "shuffle", 0x20: "shuffle_relative", 0x40: "clustered", 0x80: "quad",
}
ATOMIC_FLOAT_EXTENSION = "VK_EXT_shader_atomic_float"
PIPELINE_STATS_EXTENSION = "VK_KHR_pipeline_executable_properties"   # Kernel.statistics()
EXTERNAL_MEMORY_FD_EXTENSION = "VK_KHR_external_memory_fd"          # external.py: memory CUDA can import
# Calibrated timestamps (Sequence.host_times): the EXT name first (older validation layers, such as
# Debian 12's, know it and warn at device creation about the KHR one it was promoted to), then KHR.
CALIBRATION_EXTENSIONS = ("VK_EXT_calibrated_timestamps", "VK_KHR_calibrated_timestamps")
# VkCalibratedTimestampInfo's sType differs between the two (the binding knows only the KHR value).
CALIBRATION_STYPES = {"VK_KHR_calibrated_timestamps": 1000543000, "VK_EXT_calibrated_timestamps": 1000184000}
TIME_DOMAIN_DEVICE, TIME_DOMAIN_MONOTONIC = 0, 1   # VkTimeDomainKHR: the device's, Linux's CLOCK_MONOTONIC
INSTANCE_API_CAP = binding.make_version(1, 3)  # newest API we ask for; we need at least 1.1
INSTANCE_API_MIN = binding.make_version(1, 1)


@dataclass(frozen=True)
class DeviceInfo:
    """What one Vulkan physical device offers, in plain Python values.

    ``index`` is its position in the loader's enumeration (the value for ``SSM_VK_DEVICE``).
    Sizes are bytes; ``timestamp_period`` is nanoseconds per timestamp tick. A context's
    ``info`` may carry lowered limits (see ``Seams.override_limits``); the values here are
    what the runtime checks every request against, so callers split their work by them.
    """

    index: int
    name: str
    type: str                                  # "discrete" | "integrated" | "virtual" | "cpu" | "other"
    vendor_id: int
    device_id: int
    driver: str                                # e.g. "llvmpipe Mesa 22.3.6 (LLVM 15.0.6)"
    api_version: tuple[int, int, int]
    subgroup_size: int
    subgroup_ops: frozenset[str]               # in compute shaders: "arithmetic", "shuffle", ...
    max_shared_memory: int
    max_workgroup_size: tuple[int, int, int]
    max_workgroup_invocations: int
    max_workgroup_count: tuple[int, int, int]
    max_storage_buffer_range: int
    max_memory_allocation_size: int
    max_push_constants_size: int
    min_storage_buffer_offset_alignment: int
    max_storage_buffers_per_stage: int
    timestamp_period: float
    timestamps: bool                           # timestamps work on the compute queue we use
    timestamp_valid_bits: int
    device_local_bytes: int                    # size of the largest device-local heap
    float_atomics: bool                        # atomicAdd on float32 in storage buffers
    shader_float64: bool
    shader_int64: bool
    max_memory_allocation_count: int = 4096   # VkDeviceMemory objects at once (the spec's minimum)

    @property
    def where(self) -> str:
        """The device in ggml's words, as results report it: ``"Vulkan<index>"``."""
        return f"Vulkan{self.index}"


# Fields that Seams.override_limits may lower; each is an int or a tuple of 3 ints.
LIMIT_FIELDS = (
    "max_shared_memory", "max_workgroup_size", "max_workgroup_invocations", "max_workgroup_count",
    "max_storage_buffer_range", "max_memory_allocation_size", "max_push_constants_size",
    "max_storage_buffers_per_stage", "device_local_bytes", "max_memory_allocation_count",
)


def lowered(info: DeviceInfo, hardware: DeviceInfo, **limits) -> DeviceInfo:
    """``info`` with some limits replaced. Raises ValueError for an unknown field, a value that is
    not a positive int (or a 3-tuple of them), or a value above ``hardware``'s (the device's own)."""
    for field, value in limits.items():
        if field not in LIMIT_FIELDS:
            raise ValueError(f"override_limits: unknown limit {field!r}; known: {', '.join(LIMIT_FIELDS)}")
        current = getattr(hardware, field)
        if isinstance(current, tuple):
            ok = isinstance(value, tuple) and len(value) == 3 and all(_positive_int(v) for v in value)
            above = ok and any(v > c for v, c in zip(value, current, strict=True))
        else:
            ok = _positive_int(value)
            above = ok and value > current
        if not ok:
            expected = "3 positive ints" if isinstance(current, tuple) else "a positive int"
            raise ValueError(f"override_limits: {field} must be {expected}, got {value!r}")
        if above:
            raise ValueError(f"override_limits: {field}={value!r} is above the device's {current!r}; "
                             "limits can only be lowered")
    return dataclasses.replace(info, **limits)


def _positive_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v > 0


# ---------------------------------------------------------------------------------------------
# Instance-level helpers shared with the context

def instance_api_version() -> int:
    """The API version to request: the loader's, capped at 1.3. Raises VulkanUnavailable below 1.1."""
    vk = binding.require()
    try:
        version = vk.vkEnumerateInstanceVersion()
    except AttributeError:  # a 1.0 loader lacks the function
        version = binding.make_version(1, 0)
    if version < INSTANCE_API_MIN:
        raise VulkanUnavailable(f"the Vulkan loader offers API {binding.split_version(version)}; 1.1 is needed")
    return min(version, INSTANCE_API_CAP)


def create_instance(layers=(), extensions=(), pnext=None):
    """Create a VkInstance. Raises VulkanUnavailable when the loader finds no driver or a layer is missing."""
    vk = binding.require()
    app = vk.VkApplicationInfo(pApplicationName="ssm-scan", applicationVersion=1, pEngineName="ssm_vk.runtime",
                               engineVersion=1, apiVersion=instance_api_version())
    info = vk.VkInstanceCreateInfo(
        pNext=pnext, pApplicationInfo=app,
        enabledLayerCount=len(layers), ppEnabledLayerNames=list(layers) or None,
        enabledExtensionCount=len(extensions), ppEnabledExtensionNames=list(extensions) or None)
    try:
        return vk.vkCreateInstance(info, None)
    except vk.VkErrorIncompatibleDriver as exc:
        raise VulkanUnavailable("the Vulkan loader found no usable driver (VK_ERROR_INCOMPATIBLE_DRIVER)") from exc
    except vk.VkErrorLayerNotPresent as exc:
        raise VulkanUnavailable(f"Vulkan layer missing: {', '.join(layers)} (install vulkan-validationlayers)") from exc
    except vk.VkErrorExtensionNotPresent as exc:
        raise VulkanUnavailable(f"Vulkan instance extension missing: {', '.join(extensions)}") from exc
    except vk.VkError as exc:
        raise binding.to_package_error(exc, "vkCreateInstance") from exc


def layer_extensions(layer: str) -> frozenset[str]:
    """Instance extensions a layer offers; empty when the layer is not installed."""
    vk = binding.require()
    try:
        return frozenset(e.extensionName for e in vk.vkEnumerateInstanceExtensionProperties(layer))
    except vk.VkError:  # VK_ERROR_LAYER_NOT_PRESENT
        return frozenset()


def physical_devices(instance) -> list:
    """The instance's VkPhysicalDevice handles, in enumeration order."""
    vk = binding.require()
    with binding.translated("vkEnumeratePhysicalDevices"):
        return list(vk.vkEnumeratePhysicalDevices(instance))


def device_extensions(physical_device) -> frozenset[str]:
    vk = binding.require()
    with binding.translated("vkEnumerateDeviceExtensionProperties"):
        return frozenset(e.extensionName for e in vk.vkEnumerateDeviceExtensionProperties(physical_device, None))


def calibration_extension(instance, physical_device, extensions) -> str | None:
    """The calibrated-timestamps extension to enable on ``physical_device``, or None: one it
    offers whose time domains include the device's own and CLOCK_MONOTONIC (the clock of Python's
    ``time.monotonic`` and ``time.perf_counter`` on Linux; other systems get None)."""
    if not sys.platform.startswith("linux"):
        return None
    vk = binding.require()
    for name in CALIBRATION_EXTENSIONS:
        if name not in extensions:
            continue
        suffix = name.split("_")[1]   # KHR or EXT
        try:
            query = vk.vkGetInstanceProcAddr(instance, f"vkGetPhysicalDeviceCalibrateableTimeDomains{suffix}")
            domains = {int(d) for d in query(physical_device)}
        except Exception:  # a driver that offers the name but not the query: no calibration
            continue
        if {TIME_DOMAIN_DEVICE, TIME_DOMAIN_MONOTONIC} <= domains:
            return name
    return None


def base_extensions(calibration: str | None, extensions) -> list[str]:
    """The device extensions a context enables before the optional features: the calibration
    extension chosen (or none); VK_KHR_external_memory_fd whenever the device offers it --
    inert unless an ExportableBuffer asks for exportable memory (external.py, which relies on
    "offered" meaning "enabled")."""
    out = [calibration] if calibration else []
    if EXTERNAL_MEMORY_FD_EXTENSION in extensions:
        out.append(EXTERNAL_MEMORY_FD_EXTENSION)
    return out


def compute_queue_family(physical_device) -> tuple[int, int]:
    """(family index, timestamp valid bits) of the queue family we use for compute.

    Prefers a family with timestamps, then one without graphics (a dedicated compute queue).
    Raises VulkanUnavailable when the device has no compute queue.
    """
    vk = binding.require()
    families = vk.vkGetPhysicalDeviceQueueFamilyProperties(physical_device)
    candidates = []
    for i, fam in enumerate(families):
        flags, count, bits = int(fam.queueFlags), int(fam.queueCount), int(fam.timestampValidBits)
        if flags & vk.VK_QUEUE_COMPUTE_BIT and count > 0:
            candidates.append((bits == 0, bool(flags & vk.VK_QUEUE_GRAPHICS_BIT), i, bits))
    if not candidates:
        raise VulkanUnavailable("the device has no compute queue")
    _, _, index, bits = min(candidates)
    return index, bits


def query_features(physical_device, extensions):
    """(VkPhysicalDeviceFeatures2*, atomic-float features* or None), filled by the driver."""
    vk = binding.require()
    ffi = vk.ffi
    atomic = None
    if ATOMIC_FLOAT_EXTENSION in extensions:
        atomic = ffi.new("VkPhysicalDeviceShaderAtomicFloatFeaturesEXT*",
                         {"sType": vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_ATOMIC_FLOAT_FEATURES_EXT})
    feats = ffi.new("VkPhysicalDeviceFeatures2*", {"sType": vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2,
                                                   "pNext": atomic if atomic is not None else ffi.NULL})
    vk.vkGetPhysicalDeviceFeatures2(physical_device, feats)
    return feats, atomic


def pipeline_stats_feature(physical_device, extensions):
    """The feature struct that turns on compile statistics (pipelineExecutableInfo set), to chain
    into device creation; None when the device does not offer them."""
    if PIPELINE_STATS_EXTENSION not in extensions:
        return None
    vk = binding.require()
    feature = vk.ffi.new("VkPhysicalDevicePipelineExecutablePropertiesFeaturesKHR*", {
        "sType": vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PIPELINE_EXECUTABLE_PROPERTIES_FEATURES_KHR})
    feats = vk.ffi.new("VkPhysicalDeviceFeatures2*", {"sType": vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2,
                                                      "pNext": feature})
    vk.vkGetPhysicalDeviceFeatures2(physical_device, feats)
    return feature if feature.pipelineExecutableInfo else None


def describe(instance, physical_device, index: int, instance_version: int) -> DeviceInfo:
    """Read everything :class:`DeviceInfo` holds for one physical device."""
    vk = binding.require()
    ffi = vk.ffi
    extensions = device_extensions(physical_device)
    subgroup = ffi.new("VkPhysicalDeviceSubgroupProperties*",
                       {"sType": vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_PROPERTIES})
    maint3 = ffi.new("VkPhysicalDeviceMaintenance3Properties*",
                     {"sType": vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_MAINTENANCE_3_PROPERTIES, "pNext": subgroup})
    props = ffi.new("VkPhysicalDeviceProperties2*",
                    {"sType": vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2, "pNext": maint3})
    vk.vkGetPhysicalDeviceProperties2(physical_device, props)
    p = props.properties  # ``props`` stays referenced below until every value is copied (sharp edge 6)
    lim = p.limits
    api = min(int(p.apiVersion), instance_version)

    driver_name = ""
    if api >= binding.make_version(1, 2) or "VK_KHR_driver_properties" in extensions:
        drv = ffi.new("VkPhysicalDeviceDriverProperties*",
                      {"sType": vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_DRIVER_PROPERTIES})
        props2 = ffi.new("VkPhysicalDeviceProperties2*",
                         {"sType": vk.VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2, "pNext": drv})
        vk.vkGetPhysicalDeviceProperties2(physical_device, props2)
        driver_name = f"{binding.c_string(drv.driverName)} {binding.c_string(drv.driverInfo)}".strip()
    if not driver_name:
        driver_name = _driver_version_string(int(p.vendorID), int(p.driverVersion))

    compute_stage = bool(int(subgroup.supportedStages) & vk.VK_SHADER_STAGE_COMPUTE_BIT)
    ops = int(subgroup.supportedOperations) if compute_stage else 0
    _, ts_bits = compute_queue_family(physical_device)

    mem = vk.vkGetPhysicalDeviceMemoryProperties(physical_device)
    local = [int(mem.memoryHeaps[i].size) for i in range(int(mem.memoryHeapCount))
             if int(mem.memoryHeaps[i].flags) & vk.VK_MEMORY_HEAP_DEVICE_LOCAL_BIT]

    feats, atomic = query_features(physical_device, extensions)
    info = DeviceInfo(
        index=index,
        name=binding.c_string(p.deviceName),
        type=_TYPE_NAMES.get(int(p.deviceType), "other"),
        vendor_id=int(p.vendorID),
        device_id=int(p.deviceID),
        driver=driver_name,
        api_version=binding.split_version(int(p.apiVersion)),
        subgroup_size=int(subgroup.subgroupSize),
        subgroup_ops=frozenset(name for bit, name in _SUBGROUP_OPS.items() if ops & bit),
        max_shared_memory=int(lim.maxComputeSharedMemorySize),
        max_workgroup_size=tuple(int(lim.maxComputeWorkGroupSize[i]) for i in range(3)),
        max_workgroup_invocations=int(lim.maxComputeWorkGroupInvocations),
        max_workgroup_count=tuple(int(lim.maxComputeWorkGroupCount[i]) for i in range(3)),
        max_storage_buffer_range=int(lim.maxStorageBufferRange),
        max_memory_allocation_size=int(maint3.maxMemoryAllocationSize),
        max_push_constants_size=int(lim.maxPushConstantsSize),
        min_storage_buffer_offset_alignment=int(lim.minStorageBufferOffsetAlignment),
        max_storage_buffers_per_stage=int(lim.maxPerStageDescriptorStorageBuffers),
        timestamp_period=float(lim.timestampPeriod),
        timestamps=ts_bits > 0 and float(lim.timestampPeriod) > 0,
        timestamp_valid_bits=ts_bits,
        device_local_bytes=max(local, default=0),
        float_atomics=bool(atomic is not None and atomic.shaderBufferFloat32AtomicAdd),
        shader_float64=bool(feats.features.shaderFloat64),
        shader_int64=bool(feats.features.shaderInt64),
        max_memory_allocation_count=int(lim.maxMemoryAllocationCount),
    )
    return info


def _driver_version_string(vendor_id: int, version: int) -> str:
    if vendor_id == 0x10DE:  # NVIDIA packs 10.8.8.6 bits
        return f"{version >> 22}.{(version >> 14) & 0xFF}.{(version >> 6) & 0xFF}.{version & 0x3F}"
    major, minor, patch = binding.split_version(version)
    return f"{major}.{minor}.{patch}"


@functools.cache
def _listed() -> tuple[DeviceInfo, ...]:
    vk = binding.require()
    instance = create_instance()
    try:
        version = instance_api_version()
        return tuple(describe(instance, pd, i, version) for i, pd in enumerate(physical_devices(instance)))
    finally:
        vk.vkDestroyInstance(instance, None)


def list_devices() -> list[DeviceInfo]:
    """Every Vulkan device of this machine, in the loader's order, without creating a logical device.

    The answer is computed once per process. Raises VulkanUnavailable when there is no loader or
    no driver (an empty list means a loader and driver that report no device).
    """
    return list(_listed())


def available() -> tuple[bool, str]:
    """(True, "") when a Vulkan device can be used here, else (False, the reason). Never raises."""
    try:
        infos = list_devices()
    except VulkanUnavailable as exc:
        return False, str(exc)
    except Exception as exc:  # a broken driver must not break ``import ssm_vk`` callers
        return False, f"Vulkan device enumeration failed: {type(exc).__name__}: {exc}"
    if not infos:
        return False, "the Vulkan loader and driver report no device"
    return True, ""


def choose(infos: list[DeviceInfo] | tuple[DeviceInfo, ...], requested: int | str | None = None) -> DeviceInfo:
    """The device to use: ``requested`` (an index), else ``$SSM_VK_DEVICE``, else the first discrete
    GPU, then integrated, virtual, CPU (lavapipe).

    Raises ValueError for an index that is not an int in range, VulkanUnavailable when there is no device.
    """
    if not infos:
        raise VulkanUnavailable("no Vulkan device found")
    source = "device"
    if requested is None and config.device_env():
        requested, source = config.device_env(), DEVICE_ENV
    if requested is not None:
        try:
            index = int(requested)
        except (TypeError, ValueError):
            raise ValueError(f"{source}: expected a device index, got {requested!r}") from None
        if not 0 <= index < len(infos):
            names = "; ".join(f"{d.index}: {d.name}" for d in infos)
            raise ValueError(f"{source}={index}: no such device; there are {len(infos)} ({names})")
        return infos[index]
    return min(infos, key=lambda d: (_TYPE_PREFERENCE.index(d.type), d.index))
