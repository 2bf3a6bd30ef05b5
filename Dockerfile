# One image for the web app and the GPU worker. Mesa's Vulkan drivers cover AMD (RADV), Intel
# (ANV) and the CPU (lavapipe); NVIDIA's driver comes from the host through the NVIDIA runtime.
FROM debian:bookworm-slim

RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      python3 python3-venv libvulkan1 mesa-vulkan-drivers glslc curl ca-certificates \
 && rm -rf /var/lib/apt/lists/*

# The drivers' own caches of compiled pipelines (Mesa's: RADV, ANV, lavapipe; NVIDIA's) beside
# vkllm's SPIR-V and tuning on the cache volume, not in the container's home: a recreated worker
# container (an image update, `down` and `up`) would otherwise compile every pipeline again
# (lavapipe: a tiny model's load and first pass 41 s cold, 3 s warm).
ENV VIRTUAL_ENV=/opt/vkllm PATH=/opt/vkllm/bin:$PATH PYTHONUNBUFFERED=1 \
    VKLLM_MODELS_DIR=/models VKLLM_CACHE_DIR=/cache \
    MESA_SHADER_CACHE_DIR=/cache/mesa __GL_SHADER_DISK_CACHE_PATH=/cache/nvidia
RUN python3 -m venv $VIRTUAL_ENV

WORKDIR /src
COPY pyproject.toml README.md ./
COPY vkllm ./vkllm
COPY worker ./worker
COPY appliance ./appliance
COPY shaders ./shaders
# editable: the engine finds its GLSL sources next to the package (worker/engine/shaderbuild.py: <repo>/shaders)
RUN pip install --no-cache-dir -e . && mkdir -p /models /cache

EXPOSE 8000 9400
CMD ["vkllm", "--help"]
