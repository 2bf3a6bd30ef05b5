"""Vulkan instance, physical-device choice and the logical device with its compute queue."""
from dataclasses import dataclass

from vkllm.errors import VkllmError
from worker.engine.vk.loader import VulkanUnavailable, load_vulkan

vk = load_vulkan()

_TYPE_NAME = {vk.VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU: "discrete", vk.VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU:
              "integrated", vk.VK_PHYSICAL_DEVICE_TYPE_VIRTUAL_GPU: "virtual", vk.VK_PHYSICAL_DEVICE_TYPE_CPU: "cpu",
              vk.VK_PHYSICAL_DEVICE_TYPE_OTHER: "other"}
# Preference when no device is configured: discrete, integrated, virtual, then CPU (lavapipe).
_KIND_RANK = {"discrete": 0, "integrated": 1, "virtual": 2, "cpu": 3, "other": 4}
VALIDATION_LAYER = "VK_LAYER_KHRONOS_validation"
COOPMAT = "VK_KHR_cooperative_matrix"
INTEGER_DOT = "VK_KHR_shader_integer_dot_product"
HOST_MEMORY = "VK_EXT_external_memory_host"       # host memory imported by several devices (vk/linked.py)
SEMAPHORE_FD = "VK_KHR_external_semaphore_fd"     # a semaphore shared with another device of this GPU
ATOMIC_FLOAT = "VK_EXT_shader_atomic_float"       # atomicAdd on f32 in buffers (split-K mat-mat products)
SM_BUILTINS = "VK_NV_shader_sm_builtins"          # NVIDIA's count of SMs (multiprocessors)
CORE_PROPERTIES = "VK_AMD_shader_core_properties"  # AMD's count of compute units
_WANTED_DEVICE_EXTENSIONS = ("VK_EXT_memory_budget", COOPMAT, INTEGER_DOT, HOST_MEMORY, SEMAPHORE_FD, ATOMIC_FLOAT)


@dataclass(frozen=True)
class DeviceInfo:
    """What we need to know about a physical device to choose it and to tune kernels for it."""
    index: int
    name: str
    kind: str
    device_local_bytes: int
    subgroup_size: int
    max_storage_buffer_range: int
    storage_offset_alignment: int
    max_allocation: int
    max_workgroup_count: int
    max_push_constants: int
    timestamp_period_ns: float
    extensions: frozenset
    # Defaults are the minimums every Vulkan device guarantees.
    max_workgroup_size: int = 128      # invocations in one workgroup (x dimension and in total)
    max_shared_memory: int = 16384     # bytes of shared memory per workgroup
    driver_version: int = 0            # vendor-encoded: tuned kernel shapes are kept per driver
    api_version: int = 0
    # (M, N, K) of the subgroup-scope cooperative matrices with f16 A and B and f32 C and result
    # (VK_KHR_cooperative_matrix): the shapes the mat-mat kernel can take; empty without it
    coopmat_shapes: tuple[tuple[int, int, int], ...] = ()
    # VK_KHR_shader_integer_dot_product with its shaderIntegerDotProduct feature (the mmq
    # mat-mat kernel can run), and whether the device says dot products of packed signed 8-bit
    # 4-vectors are faster than the same arithmetic done by hand (lavapipe: no)
    int8_dot: bool = False
    int8_dot_accelerated: bool = False
    # the device's and its driver's UUIDs: devices (contexts) with equal ones can share a
    # semaphore exported as an opaque fd, where `shares_timeline` says the driver can
    uuid: bytes = b""
    shares_timeline: bool = False
    # VK_EXT_shader_atomic_float's atomicAdd on f32 in storage buffers (split-K mat-mat products)
    float_atomic_add: bool = False
    # streaming multiprocessors (NVIDIA) or compute units (AMD) where the driver tells; else 0
    multiprocessors: int = 0

    def describe(self) -> str:
        return (f"[{self.index}] {self.name} ({self.kind}, {self.device_local_bytes / 2**30:.1f} GiB, "
                f"subgroup {self.subgroup_size})")


def create_instance(validation: bool):
    layers = [VALIDATION_LAYER] if validation else []
    if validation and VALIDATION_LAYER not in {l.layerName for l in vk.vkEnumerateInstanceLayerProperties()}:
        raise VkllmError("the Vulkan validation layer is missing: install 'vulkan-validationlayers'")
    extensions = ["VK_EXT_debug_utils"] if validation else []
    app = vk.VkApplicationInfo(pApplicationName="vkllm", applicationVersion=1, pEngineName="vkllm",
                               engineVersion=1, apiVersion=vk.VK_MAKE_VERSION(1, 2, 0))
    create_info = vk.VkInstanceCreateInfo(pApplicationInfo=app, enabledLayerCount=len(layers),
                                          ppEnabledLayerNames=layers, enabledExtensionCount=len(extensions),
                                          ppEnabledExtensionNames=extensions)
    try:
        return vk.vkCreateInstance(create_info, None)
    except vk.VkErrorIncompatibleDriver as e:
        raise VulkanUnavailable("no Vulkan driver found: install 'mesa-vulkan-drivers' (AMD, Intel, or the "
                                "CPU driver lavapipe) or your GPU vendor's driver") from e


def _coopmat_shapes(instance, physical_device, extensions) -> tuple[tuple[int, int, int], ...]:
    if COOPMAT not in extensions:
        return ()
    query = vk.vkGetInstanceProcAddr(instance, "vkGetPhysicalDeviceCooperativeMatrixPropertiesKHR")
    f16, f32 = vk.VK_COMPONENT_TYPE_FLOAT16_KHR, vk.VK_COMPONENT_TYPE_FLOAT32_KHR
    return tuple(sorted({(p.MSize, p.NSize, p.KSize) for p in query(physical_device)
                         if (p.AType, p.BType, p.CType, p.ResultType) == (f16, f16, f32, f32)
                         and p.scope == vk.VK_SCOPE_SUBGROUP_KHR and not p.saturatingAccumulation}))


def _int8_dot(physical_device, extensions) -> tuple[bool, bool]:
    if INTEGER_DOT not in extensions:
        return False, False
    features = vk.VkPhysicalDeviceShaderIntegerDotProductFeatures()
    features2 = vk.VkPhysicalDeviceFeatures2(pNext=features)
    vk.vkGetPhysicalDeviceFeatures2(physical_device, features2)
    props = vk.VkPhysicalDeviceShaderIntegerDotProductProperties()
    props2 = vk.VkPhysicalDeviceProperties2(pNext=props)
    vk.vkGetPhysicalDeviceProperties2(physical_device, props2)
    return bool(features.shaderIntegerDotProduct), bool(props.integerDotProduct4x8BitPackedSignedAccelerated)


def _float_atomic_add(physical_device, extensions) -> bool:
    if ATOMIC_FLOAT not in extensions:
        return False
    features = vk.VkPhysicalDeviceShaderAtomicFloatFeaturesEXT()
    vk.vkGetPhysicalDeviceFeatures2(physical_device, vk.VkPhysicalDeviceFeatures2(pNext=features))
    return bool(features.shaderBufferFloat32AtomicAdd)


def _multiprocessors(physical_device, extensions) -> int:
    if SM_BUILTINS in extensions:
        props = vk.VkPhysicalDeviceShaderSMBuiltinsPropertiesNV()
        vk.vkGetPhysicalDeviceProperties2(physical_device, vk.VkPhysicalDeviceProperties2(pNext=props))
        return props.shaderSMCount
    if CORE_PROPERTIES in extensions:
        props = vk.VkPhysicalDeviceShaderCorePropertiesAMD()
        vk.vkGetPhysicalDeviceProperties2(physical_device, vk.VkPhysicalDeviceProperties2(pNext=props))
        return props.shaderEngineCount * props.shaderArraysPerEngineCount * props.computeUnitsPerShaderArray
    return 0


def _shares_timeline(physical_device, extensions) -> bool:
    """Timeline semaphores exported and imported as opaque fds (VK_KHR_external_semaphore_fd)."""
    if SEMAPHORE_FD not in extensions:
        return False
    timeline = vk.VkSemaphoreTypeCreateInfo(semaphoreType=vk.VK_SEMAPHORE_TYPE_TIMELINE)
    query = vk.VkPhysicalDeviceExternalSemaphoreInfo(pNext=timeline,
                                                     handleType=vk.VK_EXTERNAL_SEMAPHORE_HANDLE_TYPE_OPAQUE_FD_BIT)
    features = vk.vkGetPhysicalDeviceExternalSemaphoreProperties(physical_device, query).externalSemaphoreFeatures
    both = vk.VK_EXTERNAL_SEMAPHORE_FEATURE_EXPORTABLE_BIT | vk.VK_EXTERNAL_SEMAPHORE_FEATURE_IMPORTABLE_BIT
    return features & both == both


def describe_physical_device(instance, index, physical_device) -> DeviceInfo:
    subgroup = vk.VkPhysicalDeviceSubgroupProperties()
    ids = vk.VkPhysicalDeviceIDProperties(pNext=subgroup)
    maintenance3 = vk.VkPhysicalDeviceMaintenance3Properties(pNext=ids)
    props2 = vk.VkPhysicalDeviceProperties2(pNext=maintenance3)
    vk.vkGetPhysicalDeviceProperties2(physical_device, props2)
    props, limits = props2.properties, props2.properties.limits
    memory = vk.vkGetPhysicalDeviceMemoryProperties(physical_device)
    local = sum(memory.memoryHeaps[i].size for i in range(memory.memoryHeapCount)
                if memory.memoryHeaps[i].flags & vk.VK_MEMORY_HEAP_DEVICE_LOCAL_BIT)
    extensions = frozenset(e.extensionName for e in vk.vkEnumerateDeviceExtensionProperties(physical_device, None))
    int8_dot, int8_dot_accelerated = _int8_dot(physical_device, extensions)
    return DeviceInfo(
        index=index, name=vk.ffi.string(props.deviceName).decode(), kind=_TYPE_NAME[props.deviceType],
        device_local_bytes=local, subgroup_size=subgroup.subgroupSize,
        max_storage_buffer_range=limits.maxStorageBufferRange,
        storage_offset_alignment=limits.minStorageBufferOffsetAlignment,
        max_allocation=maintenance3.maxMemoryAllocationSize, max_workgroup_count=limits.maxComputeWorkGroupCount[0],
        max_push_constants=limits.maxPushConstantsSize, timestamp_period_ns=limits.timestampPeriod,
        extensions=extensions,
        max_workgroup_size=min(limits.maxComputeWorkGroupSize[0], limits.maxComputeWorkGroupInvocations),
        max_shared_memory=limits.maxComputeSharedMemorySize, driver_version=props.driverVersion,
        api_version=props.apiVersion, coopmat_shapes=_coopmat_shapes(instance, physical_device, extensions),
        int8_dot=int8_dot, int8_dot_accelerated=int8_dot_accelerated,
        uuid=bytes(ids.deviceUUID) + bytes(ids.driverUUID),
        shares_timeline=_shares_timeline(physical_device, extensions),
        float_atomic_add=_float_atomic_add(physical_device, extensions),
        multiprocessors=_multiprocessors(physical_device, extensions))


def list_devices(instance) -> list[tuple[DeviceInfo, object]]:
    return [(describe_physical_device(instance, i, pd), pd)
            for i, pd in enumerate(vk.vkEnumeratePhysicalDevices(instance))]


def choose_device(candidates, wanted: str | None):
    """A configured index (digits only: never a name's digits) or name substring wins; otherwise
    the best kind, then the most memory."""
    if not candidates:
        raise VulkanUnavailable("no Vulkan device found: install 'mesa-vulkan-drivers' or your GPU's driver")
    if wanted is not None:
        for info, pd in candidates:
            if wanted == str(info.index) if wanted.isdigit() else wanted.lower() in info.name.lower():
                return info, pd
        names = "; ".join(info.describe() for info, _ in candidates)
        raise VkllmError(f"no Vulkan device matches '{wanted}'; available: {names}")
    return min(candidates, key=lambda c: (_KIND_RANK[c[0].kind], -c[0].device_local_bytes))


def compute_queue_family(physical_device) -> int:
    families = vk.vkGetPhysicalDeviceQueueFamilyProperties(physical_device)
    for i, family in enumerate(families):
        if family.queueFlags & vk.VK_QUEUE_COMPUTE_BIT and family.timestampValidBits:
            return i
    for i, family in enumerate(families):
        if family.queueFlags & vk.VK_QUEUE_COMPUTE_BIT:
            return i
    raise VkllmError("the Vulkan device has no compute queue")


def create_logical_device(physical_device, info: DeviceInfo, family: int):
    usable = {COOPMAT: bool(info.coopmat_shapes), INTEGER_DOT: info.int8_dot, SEMAPHORE_FD: info.shares_timeline,
              ATOMIC_FLOAT: info.float_atomic_add}
    extensions = [e for e in _WANTED_DEVICE_EXTENSIONS if e in info.extensions and usable.get(e, True)]
    priorities = [1.0]
    queue_info = vk.VkDeviceQueueCreateInfo(queueFamilyIndex=family, queueCount=1, pQueuePriorities=priorities)
    # cooperative-matrix kernels are compiled to the Vulkan memory model (glslang does so for them)
    coopmat = COOPMAT in extensions
    chain = None   # the extensions' feature structs, linked through pNext
    if INTEGER_DOT in extensions:
        chain = vk.VkPhysicalDeviceShaderIntegerDotProductFeatures(shaderIntegerDotProduct=vk.VK_TRUE)
    if coopmat:
        chain = vk.VkPhysicalDeviceCooperativeMatrixFeaturesKHR(pNext=chain, cooperativeMatrix=vk.VK_TRUE)
    if ATOMIC_FLOAT in extensions:
        chain = vk.VkPhysicalDeviceShaderAtomicFloatFeaturesEXT(pNext=chain, shaderBufferFloat32AtomicAdd=vk.VK_TRUE)
    features12 = vk.VkPhysicalDeviceVulkan12Features(pNext=chain, shaderFloat16=vk.VK_TRUE,
                                                     shaderInt8=vk.VK_TRUE, storageBuffer8BitAccess=vk.VK_TRUE,
                                                     uniformAndStorageBuffer8BitAccess=vk.VK_TRUE,
                                                     vulkanMemoryModel=vk.VK_TRUE if coopmat else vk.VK_FALSE,
                                                     timelineSemaphore=vk.VK_TRUE)   # a Vulkan 1.2 must
    features11 = vk.VkPhysicalDeviceVulkan11Features(pNext=features12, storageBuffer16BitAccess=vk.VK_TRUE,
                                                     uniformAndStorageBuffer16BitAccess=vk.VK_TRUE)
    base = vk.VkPhysicalDeviceFeatures(shaderInt16=vk.VK_TRUE, shaderInt64=vk.VK_TRUE)
    features2 = vk.VkPhysicalDeviceFeatures2(pNext=features11, features=base)
    queue_infos = [queue_info]
    create_info = vk.VkDeviceCreateInfo(pNext=features2, queueCreateInfoCount=1, pQueueCreateInfos=queue_infos,
                                        enabledExtensionCount=len(extensions), ppEnabledExtensionNames=extensions)
    device = vk.vkCreateDevice(physical_device, create_info, None)
    return device, vk.vkGetDeviceQueue(device, family, 0), frozenset(extensions)
