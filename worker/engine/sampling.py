"""Choosing the next token on the CPU, in llama.cpp's sampler order: penalties, top-k, top-p,
min-p, temperature, then a seeded draw. Greedy decoding without penalties never gets here:
the engine takes the GPU argmax (see SamplingParams.needs_full_logits)."""
import logging
import math
from dataclasses import dataclass

import numpy as np

from vkllm.errors import VkllmError
from vkllm.sampling_defaults import SERVER, model_values
from worker.engine.errors import MinTokensUnmet

log = logging.getLogger(__name__)

# field -> (type, lowest, highest, whether the lowest is allowed), checked in __post_init__
_RANGES = {
    "temperature": (float, 0.0, math.inf, True),
    "top_k": (int, 0, math.inf, True),
    "top_p": (float, 0.0, 1.0, False),
    "min_p": (float, 0.0, 1.0, True),
    "repeat_penalty": (float, 0.0, math.inf, False),
    "repeat_last_n": (int, 0, math.inf, True),
    "presence_penalty": (float, -2.0, 2.0, True),
    "frequency_penalty": (float, -2.0, 2.0, True),
    "max_tokens": (int, 1, math.inf, True),
    "min_tokens": (int, 0, math.inf, True),
}


@dataclass(frozen=True)
class SamplingParams:
    """Defaults are llama.cpp server's (vkllm.sampling_defaults.SERVER); a model's own
    recommended values come from model_defaults."""
    temperature: float = SERVER["temperature"]
    top_k: int = SERVER["top_k"]                # 0 disables
    top_p: float = SERVER["top_p"]              # 1 disables
    min_p: float = SERVER["min_p"]              # 0 disables
    repeat_penalty: float = SERVER["repeat_penalty"]
    repeat_last_n: int = SERVER["repeat_last_n"]   # how many recent tokens the penalties look at
    presence_penalty: float = SERVER["presence_penalty"]
    frequency_penalty: float = SERVER["frequency_penalty"]
    seed: int | None = None    # None: a different draw every run
    max_tokens: int = 128
    stop: tuple[str, ...] = ()
    # vLLM's and llama.cpp server's: an end-of-generation token does not end the generation
    # (it is kept, as a token of no text); min_tokens: none is drawn before that many tokens (a
    # grammar that allows only its end before then fails the generation: Sampler._without_ends)
    ignore_eos: bool = False
    min_tokens: int = 0

    def __post_init__(self):
        stop = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())
        object.__setattr__(self, "stop", stop)
        for name, limits in _RANGES.items():
            _check_range(name, getattr(self, name), *limits)
        if self.seed is not None and (not _is_int(self.seed) or not 0 <= self.seed < 2**64):
            raise VkllmError(f"seed must be an integer in [0, 2^64) or null (got {self.seed!r})")
        if not all(isinstance(s, str) and s for s in self.stop):
            raise VkllmError("stop must be a list of non-empty strings")
        if not isinstance(self.ignore_eos, bool):
            raise VkllmError(f"ignore_eos must be true or false (got {self.ignore_eos!r})")
        if self.min_tokens > self.max_tokens:
            raise VkllmError(f"min_tokens ({self.min_tokens}) must not be above max_tokens ({self.max_tokens})")

    @property
    def is_greedy(self) -> bool:
        return self.temperature <= 0 or self.top_k == 1

    @property
    def has_penalties(self) -> bool:
        return self.repeat_last_n > 0 and (
            self.repeat_penalty != 1.0 or self.presence_penalty != 0.0 or self.frequency_penalty != 0.0)

    @property
    def needs_full_logits(self) -> bool:
        """False when the GPU argmax alone decides the token (min_tokens: it may be an
        end-of-generation token, which the sampler must pass over)."""
        return not self.is_greedy or self.has_penalties or self.min_tokens > 0

    def stops_armed(self, generated: int) -> bool:
        """Whether stop strings may end a generation that has `generated` tokens: past
        min_tokens (vLLM's rule; StopMatcher.push's `armed`)."""
        return generated > self.min_tokens


def model_defaults(metadata: dict, n_ctx: int) -> dict:
    """What a request that sets nothing samples with on this model: llama.cpp server's defaults,
    with the values the GGUF recommends (general.sampling.*). A recommended value SamplingParams
    would refuse is left out, with a warning, rather than failing every request."""
    defaults = dict(SERVER)
    for name, value in model_values(metadata, n_ctx).items():
        try:
            SamplingParams(**{name: value})
        except VkllmError as e:
            log.warning("ignoring the model's recommended %s: %s", name, e)
            continue
        defaults[name] = value
    return defaults


def _is_int(value) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def _check_range(name, value, kind, low, high, low_ok):
    number = _is_int(value) or (kind is float and isinstance(value, (float, np.floating)))
    if number and math.isfinite(value) and (value > low or (low_ok and value == low)) and value <= high:
        return
    bracket = "[" if low_ok else "("
    upper = "inf)" if high == math.inf else f"{high}]"
    what = "an integer" if kind is int else "a number"
    raise VkllmError(f"{name} must be {what} in {bracket}{low}, {upper} (got {value!r})")


class Sampler:
    """Draws one generation's tokens, in order (it counts them for min_tokens)."""

    def __init__(self, params: SamplingParams, vocab_size: int, eog_ids=()):
        self.params = params
        self.vocab_size = vocab_size
        self._rng = np.random.default_rng(params.seed)
        self._eog = np.fromiter(eog_ids, dtype=np.int64)
        self.drawn = 0

    def sample(self, logits: np.ndarray, history: list[int]) -> int:
        """logits: float32[vocab] for the next position; history: prompt + generated ids."""
        return self.sample_candidates(np.arange(self.vocab_size), logits, history)

    def sample_candidates(self, ids, logits, history: list[int]) -> int:
        """The same over a subset of the vocabulary (for instance the GPU's top-k read back).
        The subset must hold every token that could survive top-k after penalties, so with
        penalties on, read back more than top_k candidates or the full logits."""
        ids, probs = self.candidates(ids, logits, history)
        self.drawn += 1
        if len(ids) == 1:
            return int(ids[0])
        cumulative = np.cumsum(probs)
        pick = int(np.searchsorted(cumulative, self._rng.random() * cumulative[-1], side="right"))
        return int(ids[min(pick, len(ids) - 1)])

    def candidates(self, ids, logits, history: list[int]) -> tuple[np.ndarray, np.ndarray]:
        """The tokens left after penalties and filters, most likely first, with the
        probabilities the draw uses."""
        p = self.params
        ids = np.asarray(ids, dtype=np.int64)
        logits = self._penalize(ids, np.asarray(logits, dtype=np.float64), history)
        if self.drawn < p.min_tokens:
            logits = self._without_ends(ids, logits)
        if p.is_greedy:
            best = int(np.argmax(logits))
            return ids[best:best + 1], np.ones(1)
        order = _top(logits, p.top_k if 0 < p.top_k < len(logits) else len(logits))
        ids, logits = ids[order], logits[order]
        if p.top_p < 1.0:
            # keep the smallest head whose probability reaches top_p
            keep = int(np.searchsorted(np.cumsum(_softmax(logits)), p.top_p)) + 1
            ids, logits = ids[:keep], logits[:keep]
        if p.min_p > 0.0:
            keep = max(1, int(np.count_nonzero(logits >= logits[0] + math.log(p.min_p))))
            ids, logits = ids[:keep], logits[:keep]
        return ids, _softmax(logits / p.temperature)

    def _without_ends(self, ids: np.ndarray, logits: np.ndarray) -> np.ndarray:
        """min_tokens: the end-of-generation tokens' logits at -inf. Where nothing else is left
        (a grammar's mask left only its end: every other logit -inf) min_tokens cannot be met:
        MinTokensUnmet, rather than a pick the grammar refuses."""
        held = np.where(np.isin(ids, self._eog), -np.inf, logits)
        if not (held > -np.inf).any():
            raise MinTokensUnmet(f"min_tokens={self.params.min_tokens} cannot be met: the output's grammar "
                                 f"(response_format or tool_choice) is complete after {self.drawn} tokens")
        return held

    def _penalize(self, ids: np.ndarray, logits: np.ndarray, history: list[int]) -> np.ndarray:
        p = self.params
        if not p.has_penalties or not history:
            return logits
        recent = np.asarray(history[-p.repeat_last_n:], dtype=np.int64)
        counts = np.bincount(recent, minlength=self.vocab_size)[ids]
        seen = counts > 0
        # llama.cpp: shrink toward zero by repeat_penalty, then subtract the OpenAI penalties.
        scaled = np.where(logits <= 0, logits * p.repeat_penalty, logits / p.repeat_penalty)
        logits = np.where(seen, scaled, logits)
        return logits - counts * p.frequency_penalty - seen * p.presence_penalty


def _top(logits: np.ndarray, k: int) -> np.ndarray:
    """Indices of the k largest, largest first, ties by position (a stable full sort's first k)
    without sorting the whole vocabulary."""
    if k < len(logits):
        threshold = np.partition(logits, len(logits) - k)[len(logits) - k]
        above = np.flatnonzero(logits > threshold)
        tied = np.flatnonzero(logits == threshold)[:k - len(above)]
        picked = np.concatenate([above, tied])
    else:
        picked = np.arange(len(logits))
    return picked[np.argsort(-logits[picked], kind="stable")]


def _softmax(logits: np.ndarray) -> np.ndarray:
    e = np.exp(logits - logits.max())
    return e / e.sum()


class StopMatcher:
    """Cuts generated text at the first stop string. Text that could still turn out to be the
    start of a stop string is held back until the next push shows it is not."""

    def __init__(self, stop_strings: tuple[str, ...] | list[str]):
        self._stops = tuple(s for s in stop_strings if s)
        self._held = ""
        self.stopped = False

    def push(self, text: str, armed: bool = True) -> tuple[str, bool]:
        """Returns (text safe to emit, whether a stop string was reached). Unarmed (min_tokens not
        yet out, as vLLM checks), a stop string in the text does not end it; the end held back can
        still complete one once armed."""
        if self.stopped:
            return "", True
        buf = self._held + text
        hits = [i for i in (buf.find(s) for s in self._stops) if i >= 0] if armed else []
        if hits:
            self._held = ""
            self.stopped = True
            return buf[:min(hits)], True
        keep = self._partial_suffix(buf)
        self._held = buf[len(buf) - keep:] if keep else ""
        return buf[:len(buf) - keep], False

    def flush(self) -> str:
        """Releases held text at the end of generation (it never completed a stop string)."""
        held, self._held = self._held, ""
        return "" if self.stopped else held

    def _partial_suffix(self, buf: str) -> int:
        """Length of the longest end of buf that is a proper prefix of some stop string."""
        best = 0
        for s in self._stops:
            for n in range(min(len(s) - 1, len(buf)), best, -1):
                if buf.endswith(s[:n]):
                    best = n
                    break
        return best
