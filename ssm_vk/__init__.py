"""ssm_vk: the Vulkan backend (issue 4; not built yet)."""
