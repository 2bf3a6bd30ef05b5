"""The sampling parameters a request leaves unset: the model's recommended values where its GGUF
carries them (the general.sampling.* keys llama.cpp reads), else llama.cpp server's defaults.

Standard library only, for both sides: the worker reads its model's values (model_values) and
publishes the model's full defaults when it registers; the web app fills each request from what
the worker published (fill), so a job records the parameters it ran with."""

# llama.cpp server's defaults (repeat_penalty 1.0: penalties off).
SERVER = {
    "temperature": 0.8, "top_k": 40, "top_p": 0.95, "min_p": 0.05,
    "repeat_penalty": 1.0, "repeat_last_n": 64, "presence_penalty": 0.0, "frequency_penalty": 0.0,
}

# parameter -> the GGUF key that recommends a value for it (gguf's Keys.General.SAMPLING_*);
# the mirostat, XTC and sampler-sequence keys name samplers vkllm does not have.
GGUF_KEYS = {
    "temperature": "general.sampling.temp",
    "top_k": "general.sampling.top_k",
    "top_p": "general.sampling.top_p",
    "min_p": "general.sampling.min_p",
    "repeat_penalty": "general.sampling.penalty_repeat",
    "repeat_last_n": "general.sampling.penalty_last_n",
}


def model_values(metadata: dict, n_ctx: int) -> dict:
    """The values a GGUF's metadata recommends, typed as SERVER's; penalty_last_n -1 means the
    whole context, as in llama.cpp. GGUF stores float32: 7 significant digits give back the
    decimal that was written (0.3, not 0.30000001192092896)."""
    found = {}
    for name, key in GGUF_KEYS.items():
        value = metadata.get(key)
        if not isinstance(value, int | float) or isinstance(value, bool):
            continue
        if name == "repeat_last_n" and value == -1:
            value = n_ctx
        found[name] = float(f"{value:.7g}") if isinstance(SERVER[name], float) else int(value)
    return found


def fill(params: dict, model_defaults: dict | None) -> dict:
    """`params` with every sampling parameter it leaves unset (absent or None) taken from the
    model's defaults, else from SERVER."""
    return SERVER | (model_defaults or {}) | {k: v for k, v in params.items() if v is not None}


def describe(name: str) -> str:
    """How an unset parameter is chosen, in words (for the API documents)."""
    key = GGUF_KEYS.get(name)
    model = f"the model's {key} when its GGUF (or the NAME.override.json beside it) has one, else " if key else ""
    return f"unset: {model}{SERVER[name]:g} (llama.cpp server's default)"
