"""Compute kernels: :class:`Kernel` (pipeline + layouts) and its cached descriptor sets.

Shader convention (checked against the SPIR-V): storage buffers at ``set = 0``, bindings
``0 .. bindings-1``; one push-constant block of exactly ``push_size`` bytes; the workgroup size
taken from specialisation constants ``layout(local_size_x_id = 0, local_size_y_id = 1,
local_size_z_id = 2) in;`` (a dimension the shader fixes must equal ``local_size``); the
shader's own specialisation constants at ids 3, 4, ... in the order of ``spec``.
"""

from __future__ import annotations

from collections import OrderedDict

from . import binding, introspect, shaders
from .checks import check_int
from .context import Context
from .memory import Buffer
from .spirv import check_workgroup_size, workgroup_memory_bytes

_POOL_SETS_MIN, _POOL_SETS_MAX = 16, 1024  # descriptor pools grow by doubling between these
IDLE_SETS = 64   # unreferenced descriptor sets a kernel keeps cached for a repeat of their bindings


def _local_size(ctx: Context, local_size) -> tuple[int, int, int]:
    if isinstance(local_size, int) and not isinstance(local_size, bool):
        local_size = (local_size, 1, 1)
    if not isinstance(local_size, tuple | list) or len(local_size) != 3:
        raise ValueError(f"local_size: expected an int or 3 ints, got {local_size!r}")
    size = tuple(check_int("local_size", v, 1) for v in local_size)
    info = ctx.info
    if any(v > m for v, m in zip(size, info.max_workgroup_size, strict=True)):
        raise ValueError(f"local_size {size} exceeds max_workgroup_size {info.max_workgroup_size}")
    if size[0] * size[1] * size[2] > info.max_workgroup_invocations:
        raise ValueError(f"local_size {size} has {size[0] * size[1] * size[2]} invocations, "
                         f"above max_workgroup_invocations = {info.max_workgroup_invocations}")
    return size


def _spec_key(spec) -> tuple:
    if not isinstance(spec, tuple | list):
        raise TypeError(f"spec: expected a tuple of int/float/bool, got {type(spec).__name__}")
    for v in spec:
        if not isinstance(v, int | float):
            raise TypeError(f"spec: {v!r} is not an int, float or bool")
    return tuple((type(v).__name__, v) for v in spec)  # 1 and 1.0 and True are different constants


def _cache_key(name, defines, search_path, bindings, push_size, size, spec) -> tuple:
    """The key of a kernel in its context's cache (shared by Kernel.get and Kernel.cached)."""
    defs = shaders.normalize_defines(defines)
    dirs = tuple(str(p) for p in shaders.search_dirs(search_path))
    return (name, defs, dirs, bindings, push_size, tuple(size), _spec_key(spec))


class Kernel:
    """A compute pipeline with its descriptor-set layout, pipeline layout and descriptor sets.

    Get one through :meth:`Kernel.get`, which caches it in the context. Attributes: ``name``,
    ``bindings`` (number of storage buffers), ``push_size``, ``local_size``, ``spec``.
    It lives until its context closes (or ``close()``).
    """

    @classmethod
    def get(cls, ctx: Context, name: str, *, bindings: int, push_size: int = 0, local_size=(64, 1, 1),
            spec=(), defines=None, search_path=None) -> Kernel:
        """The kernel for shader ``name`` (see :func:`shaders.compile_shader` for ``defines`` and
        ``search_path``), built once per context and argument set.

        Raises TypeError/ValueError for bad arguments or a shader that fixes another workgroup
        size (all before any Vulkan call), what ``compile_shader`` raises, VulkanError, DeviceLost.
        """
        if not isinstance(ctx, Context):
            raise TypeError(f"ctx: expected a Context, got {type(ctx).__name__}")
        info = ctx.info
        check_int("bindings", bindings, 1)
        if bindings > info.max_storage_buffers_per_stage:
            raise ValueError(f"bindings={bindings} exceeds max_storage_buffers_per_stage = "
                             f"{info.max_storage_buffers_per_stage}")
        if check_int("push_size", push_size) % 4:
            raise ValueError(f"push_size: expected a multiple of 4, got {push_size}")
        if push_size > info.max_push_constants_size:
            raise ValueError(f"push_size={push_size} exceeds max_push_constants_size = {info.max_push_constants_size}")
        size = _local_size(ctx, local_size)
        key = _cache_key(name, defines, search_path, bindings, push_size, size, spec)
        _, defs, dirs = key[:3]
        kernel = ctx.cached_kernel(key)
        if kernel is not None:
            return kernel
        ctx.check_usable()
        spirv = shaders.compile_shader(name, dict(defs) or None, search_path=list(dirs))  # outside the lock (glslc)
        # (unless another thread built it meanwhile)
        return ctx.cache_kernel(key, lambda: cls(ctx, name, spirv, bindings, push_size, size, tuple(spec),
                                                 dict(defs)))

    @classmethod
    def cached(cls, ctx: Context, name: str, *, bindings: int, push_size: int = 0, local_size=(64, 1, 1),
               spec=(), defines=None, search_path=None) -> Kernel | None:
        """The kernel :meth:`get` would return from the context's cache, or None when ``get``
        would have to build it (compile the shader). Arguments as for ``get``; nothing is built."""
        if isinstance(local_size, int) and not isinstance(local_size, bool):
            local_size = (local_size, 1, 1)
        key = _cache_key(name, defines, search_path, bindings, push_size, tuple(local_size), spec)
        return ctx.cached_kernel(key)

    def __init__(self, ctx: Context, name: str, spirv: bytes, bindings: int, push_size: int,
                 local_size: tuple[int, int, int], spec: tuple, defines: dict | None = None):
        """Internal: use :meth:`get`. Arguments are checked by ``get``."""
        check_workgroup_size(spirv, local_size, name)
        shared = workgroup_memory_bytes(spirv)
        if shared > ctx.info.max_shared_memory:
            raise ValueError(f"{name}: {shared} bytes of shared memory exceed max_shared_memory = "
                             f"{ctx.info.max_shared_memory}")
        vk = binding.require()
        self.ctx, self.name, self.bindings = ctx, name, bindings
        self.push_size, self.local_size, self.spec = push_size, local_size, spec
        self.defines = dict(defines or {})
        self.closed = False
        self._set_layout = self._layout = self.pipeline = None
        self._pools: list = []
        self._pool_room = 0
        # Descriptor sets, by binding key: each is referenced by the recorded sequences that bind
        # it (acquire_set / release_set); an unreferenced one stays cached for a repeat of its key
        # until IDLE_SETS others are idle, then it is rewritten for a new key. So live sets stay
        # bounded by the sequences alive, however many buffer combinations pass through.
        self._sets: dict[tuple, object] = {}            # binding key → VkDescriptorSet
        self._refs: dict[tuple, int] = {}               # binding key → sequences that bind it
        self._idle: OrderedDict = OrderedDict()         # unreferenced keys of _sets, least recent first
        self._dead: dict[tuple, object] = {}            # keys with a closed buffer, still referenced
        self._keys_of_buffer: dict[int, set] = {}       # buffer serial → binding keys using it
        self._free_sets: list = []                      # sets to rewrite
        device = ctx.handle
        module = None
        try:
            with binding.translated(f"creating kernel {name}"):
                module_info = vk.VkShaderModuleCreateInfo(codeSize=len(spirv), pCode=spirv)  # bytes (sharp edge 4)
                module = vk.vkCreateShaderModule(device, module_info, None)
                layout_bindings = [vk.VkDescriptorSetLayoutBinding(
                    binding=i, descriptorType=vk.VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, descriptorCount=1,
                    stageFlags=vk.VK_SHADER_STAGE_COMPUTE_BIT) for i in range(bindings)]
                self._set_layout = vk.vkCreateDescriptorSetLayout(device, vk.VkDescriptorSetLayoutCreateInfo(
                    bindingCount=bindings, pBindings=layout_bindings), None)
                ranges = [vk.VkPushConstantRange(stageFlags=vk.VK_SHADER_STAGE_COMPUTE_BIT, offset=0, size=push_size)]
                if not push_size:
                    ranges = []
                self._layout = vk.vkCreatePipelineLayout(device, vk.VkPipelineLayoutCreateInfo(
                    setLayoutCount=1, pSetLayouts=[self._set_layout],
                    pushConstantRangeCount=len(ranges), pPushConstantRanges=ranges or None), None)
                values = [*local_size, *spec]
                data, nbytes = binding.words_arg(values)  # kept alive until vkCreateComputePipelines returns
                # constant_id i ↔ values[i]: 0-2 the workgroup size, 3.. the shader's own constants
                entries = [vk.VkSpecializationMapEntry(constantID=i, offset=4 * i, size=4) for i in range(len(values))]
                spec_info = vk.VkSpecializationInfo(mapEntryCount=len(entries), pMapEntries=entries,
                                                    dataSize=nbytes, pData=data)  # bytes, not the cdata's length
                stage = vk.VkPipelineShaderStageCreateInfo(stage=vk.VK_SHADER_STAGE_COMPUTE_BIT, module=module,
                                                           pName="main", pSpecializationInfo=spec_info)
                flags = introspect.capture_flags() if ctx.pipeline_stats else 0
                self.pipeline = vk.vkCreateComputePipelines(device, None, 1, [vk.VkComputePipelineCreateInfo(
                    flags=flags, stage=stage, layout=self._layout)], None)[0]
                ctx.stats.pipelines += 1
            ctx.owned.adopt(self)
        except BaseException:
            self._release()
            raise
        finally:
            if module is not None:  # the pipeline keeps what it needs
                vk.vkDestroyShaderModule(device, module, None)

    # -- descriptor sets ----------------------------------------------------------------------------

    def normalize_bindings(self, bindings) -> tuple[tuple[Buffer, int, int], ...]:
        """``bindings`` as (buffer, offset, nbytes) triples, each checked.

        An item is a Buffer (all of it) or ``(buffer, offset, nbytes)``. Raises TypeError/ValueError
        for a wrong count, a foreign or closed buffer, an offset not a multiple of
        min_storage_buffer_offset_alignment, a range outside the buffer or above max_storage_buffer_range.
        """
        if not isinstance(bindings, list | tuple) or len(bindings) != self.bindings:
            got = len(bindings) if isinstance(bindings, list | tuple) else type(bindings).__name__
            raise ValueError(f"kernel {self.name}: expected {self.bindings} bindings, got {got}")
        info = self.ctx.info
        out = []
        for i, item in enumerate(bindings):
            if isinstance(item, Buffer):
                buf, offset, nbytes = item, 0, item.size
            elif isinstance(item, tuple) and len(item) == 3 and isinstance(item[0], Buffer):
                buf, offset, nbytes = item
            else:
                raise TypeError(f"kernel {self.name} binding {i}: expected a Buffer or (Buffer, offset, nbytes), "
                                f"got {item!r}")
            if buf.ctx is not self.ctx or buf.closed or buf.staging:
                raise ValueError(f"kernel {self.name} binding {i}: {buf!r} is closed, a staging buffer "
                                 "or from another context")
            offset = check_int(f"kernel {self.name} binding {i} offset", offset)
            nbytes = check_int(f"kernel {self.name} binding {i} nbytes", nbytes, 1)
            if offset % info.min_storage_buffer_offset_alignment:
                raise ValueError(f"kernel {self.name} binding {i}: offset {offset} is not a multiple of "
                                 f"min_storage_buffer_offset_alignment = {info.min_storage_buffer_offset_alignment}")
            if offset + nbytes > buf.size:
                raise ValueError(f"kernel {self.name} binding {i}: {nbytes} bytes at offset {offset} exceed {buf!r}")
            if nbytes > info.max_storage_buffer_range:
                raise ValueError(f"kernel {self.name} binding {i}: range of {nbytes} bytes exceeds "
                                 f"max_storage_buffer_range = {info.max_storage_buffer_range}; split the work")
            out.append((buf, offset, nbytes))
        return tuple(out)

    def acquire_set(self, bindings) -> tuple[object, tuple]:
        """(the VkDescriptorSet for ``bindings``, its key), referenced until :meth:`release_set`
        of that key: written once per distinct (buffer, offset, nbytes) list and then reused (a
        write costs several times a hit: docs/VULKAN.md, "Costs measured on lavapipe"). A set is
        never rewritten while referenced (a recorded command buffer binds it). Raises as :meth:`normalize_bindings`."""
        triples = self.normalize_bindings(bindings)
        key = tuple((b.serial, off, n) for b, off, n in triples)
        ctx = self.ctx
        with ctx.lock:
            dset = self._sets.get(key)
            if dset is not None:
                if self._refs.get(key, 0) == 0:
                    self._idle.pop(key, None)
                self._refs[key] = self._refs.get(key, 0) + 1
                return dset, key
            if self.closed:
                raise RuntimeError(f"kernel {self.name} is closed")
            ctx.check_usable()
            if self._free_sets:
                dset = self._free_sets.pop()
            elif len(self._idle) >= IDLE_SETS:
                dset = self._drop(next(iter(self._idle)))  # the least recently used idle set
            else:
                dset = self._allocate_set()
            _write_set(ctx.handle, dset, triples)
            ctx.stats.descriptor_writes += 1
            self._sets[key] = dset
            self._refs[key] = 1
            for serial, _, _ in key:
                self._keys_of_buffer.setdefault(serial, set()).add(key)
            return dset, key

    def release_set(self, key: tuple) -> None:
        """One reference to the set of ``key`` fewer (a sequence that bound it closed or reset)."""
        with self.ctx.lock:
            n = self._refs.get(key, 0) - 1
            if n > 0:
                self._refs[key] = n
                return
            self._refs.pop(key, None)
            dead = self._dead.pop(key, None)
            if dead is not None:
                self._free_sets.append(dead)
            elif key in self._sets:
                self._idle[key] = None
                while len(self._idle) > IDLE_SETS:
                    self._free_sets.append(self._drop(next(iter(self._idle))))

    def _drop(self, key: tuple):
        """Take the set of ``key`` out of the cache (and its buffers' key lists); returns it, or
        None when it was not cached."""
        self._idle.pop(key, None)
        dset = self._sets.pop(key, None)
        for serial, _, _ in key:
            keys = self._keys_of_buffer.get(serial)
            if keys is not None:
                keys.discard(key)
                if not keys:
                    del self._keys_of_buffer[serial]
        return dset

    @property
    def live_sets(self) -> int:
        """Descriptor sets this kernel holds, in use, cached or free (for leak tests)."""
        with self.ctx.lock:
            return len(self._sets) + len(self._dead) + len(self._free_sets)

    def _allocate_set(self):
        vk = binding.require()
        device = self.ctx.handle
        if self._pool_room == 0:
            n_sets = min(_POOL_SETS_MAX, _POOL_SETS_MIN << len(self._pools))
            size = vk.VkDescriptorPoolSize(type=vk.VK_DESCRIPTOR_TYPE_STORAGE_BUFFER,
                                           descriptorCount=n_sets * self.bindings)
            with binding.translated("vkCreateDescriptorPool"):
                self._pools.append(vk.vkCreateDescriptorPool(device, vk.VkDescriptorPoolCreateInfo(
                    maxSets=n_sets, poolSizeCount=1, pPoolSizes=[size]), None))
            self._pool_room = n_sets
        ffi = vk.ffi  # raw cffi: the binding's struct constructors are slow here (docs/VULKAN.md)
        layouts = ffi.new("VkDescriptorSetLayout[1]", [self._set_layout])  # a local: cffi fields don't own it
        info = ffi.new("VkDescriptorSetAllocateInfo*", {
            "sType": vk.VK_STRUCTURE_TYPE_DESCRIPTOR_SET_ALLOCATE_INFO, "descriptorPool": self._pools[-1],
            "descriptorSetCount": 1, "pSetLayouts": layouts})
        out = ffi.new("VkDescriptorSet[1]")
        binding.check_result(vk.lib.vkAllocateDescriptorSets(device, info, out), "vkAllocateDescriptorSets")
        dset = out[0]
        self._pool_room -= 1
        self.ctx.stats.descriptor_sets += 1
        return dset

    def forget_buffer(self, serial: int) -> None:
        """Drop the sets that point at a closed buffer: unreferenced ones are rewritten for later
        bindings, referenced ones once their sequences let go (those cannot run any more)."""
        for key in list(self._keys_of_buffer.get(serial, ())):
            referenced = self._refs.get(key, 0) > 0
            dset = self._drop(key)
            if dset is None:
                continue
            if referenced:
                self._dead[key] = dset
            else:
                self._free_sets.append(dset)
        self._keys_of_buffer.pop(serial, None)

    # -- lifetime -----------------------------------------------------------------------------------

    def close(self) -> None:
        """Destroy the pipeline, layouts and descriptor pools (waits for submitted work). Idempotent."""
        if self.closed:
            return
        ctx = self.ctx
        if not ctx.lost and not ctx.closed:
            ctx.wait_idle()
        with ctx.lock:
            self.closed = True
            ctx.closures += 1  # Sequence.submit checks its kernels again
            self._sets.clear()
            self._refs.clear()
            self._idle.clear()
            self._dead.clear()
            self._keys_of_buffer.clear()
            self._free_sets.clear()
            ctx.owned.forget(self)
            self._release()

    def _release(self) -> None:
        vk = binding.require()
        device = self.ctx.handle
        for pool in self._pools:  # frees their sets too
            vk.vkDestroyDescriptorPool(device, pool, None)
        self._pools = []
        if self.pipeline is not None:
            vk.vkDestroyPipeline(device, self.pipeline, None)
            self.pipeline = None
        if self._layout is not None:
            vk.vkDestroyPipelineLayout(device, self._layout, None)
            self._layout = None
        if self._set_layout is not None:
            vk.vkDestroyDescriptorSetLayout(device, self._set_layout, None)
            self._set_layout = None

    def statistics(self) -> dict:
        """The driver's compile statistics of this kernel: :func:`introspect.statistics`."""
        return introspect.statistics(self)

    def representations(self) -> list:
        """What the driver made of this kernel's code: :func:`introspect.representations`."""
        return introspect.representations(self)

    @property
    def layout(self):
        """The VkPipelineLayout (commands.py binds sets and pushes constants through it)."""
        return self._layout

    def __repr__(self) -> str:
        return (f"<Kernel {self.name} bindings={self.bindings} push={self.push_size} local_size={self.local_size}"
                f"{' closed' if self.closed else ''}>")


def _write_set(device, dset, triples) -> None:
    """One vkUpdateDescriptorSets for all bindings, its structs built straight in cffi: the
    binding's struct constructors cost many times the write (docs/VULKAN.md, "Costs measured on
    lavapipe")."""
    vk = binding.require()
    ffi = vk.ffi
    n = len(triples)
    infos = ffi.new("VkDescriptorBufferInfo[]", n)
    writes = ffi.new("VkWriteDescriptorSet[]", n)
    for i, (buf, offset, nbytes) in enumerate(triples):
        infos[i].buffer, infos[i].offset, infos[i].range = buf.handle, offset, nbytes  # never VK_WHOLE_SIZE (edge 3)
        w = writes[i]
        w.sType = vk.VK_STRUCTURE_TYPE_WRITE_DESCRIPTOR_SET
        w.dstSet, w.dstBinding, w.descriptorCount = dset, i, 1
        w.descriptorType = vk.VK_DESCRIPTOR_TYPE_STORAGE_BUFFER
        w.pBufferInfo = infos + i  # ``infos`` outlives the call below
    vk.lib.vkUpdateDescriptorSets(device, n, writes, 0, ffi.NULL)
