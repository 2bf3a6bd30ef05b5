"""What the web app (appliance/) and the GPU worker (worker/) share, and nothing else: the Redis
contract (protocol), user-facing errors, the commands' settings, the demo model's download, the
watchdog both sides run over the queues (orphans: the Redis and RQ clients), and the `vkllm`
command's entry point. Neither Flask, the engine nor Vulkan is imported here."""
