"""What a generation yields: the contract between the engine and the worker service."""
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Timings:
    prompt_tokens: int = 0
    generated_tokens: int = 0
    prompt_seconds: float = 0.0        # prefill wall time
    generation_seconds: float = 0.0    # decode wall time, first token excluded
    time_to_first_token: float = 0.0   # from the call to the first generated token

    @property
    def prefilled(self) -> bool:
        """Whether the prompt's prefill was done, its first token out (a job cancelled mid-prompt
        has neither a time to first token nor a whole prefill to measure)."""
        return self.generated_tokens > 0

    @property
    def prompt_tokens_per_second(self) -> float:
        return self.prompt_tokens / self.prompt_seconds if self.prompt_seconds else 0.0

    @property
    def generation_tokens_per_second(self) -> float:
        n = self.generated_tokens - 1
        return n / self.generation_seconds if n > 0 and self.generation_seconds else 0.0


@dataclass(frozen=True)
class TokenLogprobs:
    """A generated token's log-probability under the model (the log-softmax of its logits, before
    any sampling filter), and the most likely tokens at that step with theirs, most likely first."""
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


@dataclass(frozen=True)
class Event:
    """One step of a generation. Every event but the last carries new text (possibly empty when
    a token ends inside a UTF-8 sequence or could start a stop string). The last has
    finish_reason set ("stop", "length" or "cancelled") and the final timings. logprobs is set
    on token events when the generation was asked for them. A batched generation that fails alone
    (its grammar gives up, or a min_tokens it cannot meet) ends with finish_reason "error" and the error."""
    text: str
    token_id: int | None = None
    finish_reason: str | None = None
    timings: Timings = field(default_factory=Timings)
    logprobs: TokenLogprobs | None = None
    error: Exception | None = None
