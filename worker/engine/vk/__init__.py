"""Vulkan runtime: device choice (device.py), memory (memory.py), pipelines (pipeline.py),
recorded command buffers (commands.py) and the Context that owns them (context.py). No Flask, no
RQ. Importing any module here loads libvulkan (loader.py turns its absence into one clear line),
so the CLI imports them inside the commands that need a GPU."""
