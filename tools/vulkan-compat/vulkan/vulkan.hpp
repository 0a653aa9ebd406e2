// Vulkan-Hpp as the system has it, plus the few declarations of VK_EXT_layer_settings (Vulkan
// headers 1.3.261) that ggml's Vulkan backend uses, for headers older than that (Debian 12's
// 1.3.239). Put this folder first on the include path (tools/build_ggml.sh --vulkan-compat); with
// newer headers it adds nothing. Written from the extension's specification: the C layout of
// VkLayerSettingEXT and VkLayerSettingsCreateInfoEXT, and the C++ names ggml spells.
#pragma once
#include_next <vulkan/vulkan.hpp>

#ifndef VK_EXT_layer_settings
#define VK_EXT_layer_settings 1
#include <cstdint>
#include <vector>

namespace vk {

enum class LayerSettingTypeEXT : int32_t {
    eBool32 = 0, eInt32 = 1, eInt64 = 2, eUint32 = 3, eUint64 = 4, eFloat32 = 5, eFloat64 = 6, eString = 7,
};

struct LayerSettingEXT {
    const char* pLayerName;
    const char* pSettingName;
    LayerSettingTypeEXT type;
    uint32_t valueCount;
    const void* pValues;
};

struct LayerSettingsCreateInfoEXT {
    VkStructureType sType = static_cast<VkStructureType>(1000496000);  // ..._LAYER_SETTINGS_CREATE_INFO_EXT
    const void* pNext = nullptr;
    uint32_t settingCount = 0;
    const LayerSettingEXT* pSettings = nullptr;

    explicit LayerSettingsCreateInfoEXT(const std::vector<LayerSettingEXT>& settings)
        : settingCount(static_cast<uint32_t>(settings.size())), pSettings(settings.data()) {}
};

}  // namespace vk
#endif
