"""Command-line tools over the engine (`vkllm devices | models | generate | bench | tune`) and the
synthetic-model writer (synth*.py, quant.py) the tests and benchmarks use."""
