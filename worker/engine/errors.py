"""The engine's user-facing errors (all VkllmError: the CLI and the worker print them as one line)."""
from vkllm.errors import VkllmError


class GGUFError(VkllmError):
    """The file is not a GGUF model this engine can run; the message names the problem."""


class PromptTooLong(VkllmError):
    """The prompt does not fit the context the model was loaded with."""


class KVCacheFull(VkllmError):
    """Every block of the paged KV cache is held by running sequences."""


class MinTokensUnmet(VkllmError):
    """A constrained output (response_format, a forced tool call) whose grammar allows only its end
    before min_tokens tokens are out: the generation fails alone (Batch), the others go on."""
