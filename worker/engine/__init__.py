"""The inference engine: GGUF files (modelfile), model families (models/), GPU kernels (kernels/)
over the Vulkan runtime (vk/), tokenizer, chat templates, sampling, and the Engine that ties them
together (engine.py). Importable without Flask or RQ."""
