"""The GPU side of vkllm: the inference engine (engine/), the RQ worker process that hosts it
(service/), and the command-line tools over the engine (tools/: devices, models, generate, bench,
tune, synth)."""
