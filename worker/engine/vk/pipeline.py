"""Compute pipelines from SPIR-V: one descriptor-set layout of N storage buffers, a push-constant
block (packed by name, worker/engine/vk/spirv.py), and specialization constants fixed at build
time (cached per value set)."""
import struct

from worker.engine.vk.loader import load_vulkan

vk = load_vulkan()

PUSH_CONSTANT_BYTES = 128  # the minimum every Vulkan device guarantees


class Kernel:
    """A compute pipeline plus the layouts a dispatch needs."""

    def __init__(self, device, name: str, shader, spec: dict[int, int]):
        """`shader`: a shaderbuild.Shader."""
        self.device, self.name = device, name
        self.bindings, self.push = shader.variant.bindings, shader.push
        bindings, spirv = self.bindings, shader.spirv
        module_info = vk.VkShaderModuleCreateInfo(codeSize=len(spirv), pCode=spirv)
        self.shader_module = vk.vkCreateShaderModule(device, module_info, None)
        layout_bindings = [vk.VkDescriptorSetLayoutBinding(
            binding=i, descriptorType=vk.VK_DESCRIPTOR_TYPE_STORAGE_BUFFER, descriptorCount=1,
            stageFlags=vk.VK_SHADER_STAGE_COMPUTE_BIT) for i in range(bindings)]
        set_info = vk.VkDescriptorSetLayoutCreateInfo(bindingCount=bindings, pBindings=layout_bindings)
        self.descriptor_set_layout = vk.vkCreateDescriptorSetLayout(device, set_info, None)
        push_range = vk.VkPushConstantRange(stageFlags=vk.VK_SHADER_STAGE_COMPUTE_BIT, offset=0,
                                            size=PUSH_CONSTANT_BYTES)
        set_layouts, push_ranges = [self.descriptor_set_layout], [push_range]
        layout_info = vk.VkPipelineLayoutCreateInfo(setLayoutCount=1, pSetLayouts=set_layouts,
                                                    pushConstantRangeCount=1, pPushConstantRanges=push_ranges)
        self.pipeline_layout = vk.vkCreatePipelineLayout(device, layout_info, None)
        ids = sorted(spec)
        entries = [vk.VkSpecializationMapEntry(constantID=i, offset=4 * n, size=4) for n, i in enumerate(ids)]
        data = struct.pack(f"<{len(ids)}I", *(spec[i] for i in ids))
        spec_info = vk.VkSpecializationInfo(mapEntryCount=len(entries), pMapEntries=entries or None,
                                            dataSize=len(data), pData=vk.ffi.from_buffer(data) if data else None)
        stage = vk.VkPipelineShaderStageCreateInfo(stage=vk.VK_SHADER_STAGE_COMPUTE_BIT, module=self.shader_module,
                                                   pName="main", pSpecializationInfo=spec_info)
        pipeline_info = vk.VkComputePipelineCreateInfo(stage=stage, layout=self.pipeline_layout)
        infos = [pipeline_info]
        self.compute_pipeline = vk.vkCreateComputePipelines(device, None, 1, infos, None)[0]

    def destroy(self):
        vk.vkDestroyPipeline(self.device, self.compute_pipeline, None)
        vk.vkDestroyPipelineLayout(self.device, self.pipeline_layout, None)
        vk.vkDestroyDescriptorSetLayout(self.device, self.descriptor_set_layout, None)
        vk.vkDestroyShaderModule(self.device, self.shader_module, None)
