"""Validation-layer messages collected through VK_EXT_debug_utils, so tests can fail on them."""
from worker.engine.vk.loader import load_vulkan

vk = load_vulkan()


class ValidationLog:
    """Collects warning and error messages; `errors` is what tests assert is empty."""

    def __init__(self, instance):
        self.instance = instance
        self.errors: list[str] = []
        self.warnings: list[str] = []
        severity = (vk.VK_DEBUG_UTILS_MESSAGE_SEVERITY_WARNING_BIT_EXT
                    | vk.VK_DEBUG_UTILS_MESSAGE_SEVERITY_ERROR_BIT_EXT)
        types = (vk.VK_DEBUG_UTILS_MESSAGE_TYPE_GENERAL_BIT_EXT | vk.VK_DEBUG_UTILS_MESSAGE_TYPE_VALIDATION_BIT_EXT
                 | vk.VK_DEBUG_UTILS_MESSAGE_TYPE_PERFORMANCE_BIT_EXT)
        self._create_info = vk.VkDebugUtilsMessengerCreateInfoEXT(
            messageSeverity=severity, messageType=types, pfnUserCallback=self._callback)
        create = vk.vkGetInstanceProcAddr(instance, "vkCreateDebugUtilsMessengerEXT")
        self._destroy = vk.vkGetInstanceProcAddr(instance, "vkDestroyDebugUtilsMessengerEXT")
        self.messenger = create(instance, self._create_info, None)

    def _callback(self, severity, types, data, user_data):
        message = vk.ffi.string(data.pMessage).decode(errors="replace")
        if severity & vk.VK_DEBUG_UTILS_MESSAGE_SEVERITY_ERROR_BIT_EXT:
            self.errors.append(message)
        else:
            self.warnings.append(message)
        return 0

    def destroy(self):
        self._destroy(self.instance, self.messenger, None)
