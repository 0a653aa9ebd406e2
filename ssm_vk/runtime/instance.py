"""The process's VkInstance, and the validation layer on it: its instance setup and the
debug-utils messenger that keeps what it reports.

One instance per process and validation setting (:func:`process_instance`), shared by every
context the process makes and destroyed at exit. A context with validation on makes a
:class:`Messenger` that appends each warning or error to its ``validation_messages``.

The context's fork rule covers this module's state too: ``context``'s after-fork hook calls
:func:`forget_after_fork` (this module registers none of its own).
"""

from __future__ import annotations

import atexit
import threading

from . import binding, device

VALIDATION_LAYER = "VK_LAYER_KHRONOS_validation"
DEBUG_UTILS_EXTENSION = "VK_EXT_debug_utils"
VALIDATION_FEATURES_EXTENSION = "VK_EXT_validation_features"  # offered by the validation layer

# One VkInstance per process (per validation setting), shared by every context it makes. Seen on
# an NVIDIA H200 (driver 580.159.04): the 31st vkCreateInstance of a process fails with
# VK_ERROR_INCOMPATIBLE_DRIVER although every earlier instance was destroyed, while devices can be
# made and destroyed any number of times -- so a process that replaced its context 30 times (a lost
# device, close() and get_context()) could not use Vulkan any more.
_instances: dict[bool, object] = {}
_instances_lock = threading.Lock()


def process_instance(validation: bool):
    """The process's VkInstance, with the validation layer (and its synchronization checks, where
    offered) when ``validation``; made on first use, destroyed at exit."""
    with _instances_lock:
        inst = _instances.get(validation)
        if inst is not None:
            return inst
        vk = binding.require()
        layers, extensions, pnext = [], [], None
        if validation:
            layers, extensions = [VALIDATION_LAYER], [DEBUG_UTILS_EXTENSION]
            if VALIDATION_FEATURES_EXTENSION in device.layer_extensions(VALIDATION_LAYER):
                # Synchronization validation as well: a missing barrier is the mistake lavapipe
                # hides best (it happens to run commands in order).
                extensions.append(VALIDATION_FEATURES_EXTENSION)
                pnext = vk.VkValidationFeaturesEXT(
                    enabledValidationFeatureCount=1,
                    pEnabledValidationFeatures=[vk.VK_VALIDATION_FEATURE_ENABLE_SYNCHRONIZATION_VALIDATION_EXT])
        inst = _instances[validation] = device.create_instance(layers, extensions, pnext)
        if len(_instances) == 1:
            atexit.register(_destroy_instances)  # after every context's close (atexit runs newest first)
        return inst


def _destroy_instances() -> None:
    with _instances_lock:
        insts = list(_instances.values())
        _instances.clear()
    if insts:
        vk = binding.require()
        for inst in insts:
            vk.vkDestroyInstance(inst, None)


def forget_after_fork() -> None:
    """In a forked child: drop the parent's instances (never destroyed here) and renew the lock a
    parent thread may have held at the fork."""
    global _instances_lock
    _instances_lock = threading.Lock()
    _instances.clear()


class Messenger:
    """The validation layer's debug-utils messenger on ``instance`` (made with the validation
    layer): every warning or error it reports is appended to ``messages`` as "LEVEL: text".
    :meth:`destroy` removes it. Raises VulkanError when it cannot be made."""

    def __init__(self, instance, messages: list[str]):
        vk = binding.require()
        self._instance = instance

        def on_message(severity, types, data, _user):
            # Runs inside a Vulkan call on any thread; it must not raise (cffi would only print).
            try:
                level = "ERROR" if severity & vk.VK_DEBUG_UTILS_MESSAGE_SEVERITY_ERROR_BIT_EXT else "WARNING"
                messages.append(f"{level}: {binding.c_string(data.pMessage)}")
            except Exception as exc:
                messages.append(f"ERROR: unreadable validation message ({exc})")
            return 0

        self._callback = on_message  # the binding keeps one module-wide callback; we keep ours too
        info = vk.VkDebugUtilsMessengerCreateInfoEXT(
            messageSeverity=vk.VK_DEBUG_UTILS_MESSAGE_SEVERITY_WARNING_BIT_EXT
            | vk.VK_DEBUG_UTILS_MESSAGE_SEVERITY_ERROR_BIT_EXT,
            messageType=vk.VK_DEBUG_UTILS_MESSAGE_TYPE_GENERAL_BIT_EXT
            | vk.VK_DEBUG_UTILS_MESSAGE_TYPE_VALIDATION_BIT_EXT
            | vk.VK_DEBUG_UTILS_MESSAGE_TYPE_PERFORMANCE_BIT_EXT,
            pfnUserCallback=on_message)
        create = vk.vkGetInstanceProcAddr(instance, "vkCreateDebugUtilsMessengerEXT")
        with binding.translated("vkCreateDebugUtilsMessengerEXT"):
            self._handle = create(instance, info, None)

    def destroy(self) -> None:
        """Remove the messenger (idempotent)."""
        if self._handle is not None:
            vk = binding.require()
            destroy = vk.vkGetInstanceProcAddr(self._instance, "vkDestroyDebugUtilsMessengerEXT")
            destroy(self._instance, self._handle, None)
            self._handle = None
