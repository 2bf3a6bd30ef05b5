"""Import the `vulkan` bindings, turning a missing loader into a one-line, actionable error."""
from vkllm.errors import VkllmError


class VulkanUnavailable(VkllmError):
    pass


def load_vulkan():
    try:
        import vulkan
    except OSError as e:  # cffi cannot dlopen libvulkan.so.1
        raise VulkanUnavailable(
            "the Vulkan loader (libvulkan.so.1) is missing: install the 'libvulkan1' package "
            "and a driver (e.g. 'mesa-vulkan-drivers')") from e
    except ImportError as e:
        raise VulkanUnavailable("the Python package 'vulkan' is missing: pip install vulkan") from e
    return vulkan
