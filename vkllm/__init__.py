"""What the web app (appliance/) and the GPU worker (worker/) share, and nothing else: the Redis
contract (protocol), user-facing errors, the demo model's download, and the `vkllm` command's
entry point. Standard library only: importing it loads neither Flask, RQ nor Vulkan."""
