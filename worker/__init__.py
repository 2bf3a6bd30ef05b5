"""vkllm worker: the Vulkan inference engine and the RQ worker process that hosts it."""
