"""One generation's host side inside a Batch (worker/engine/batch.py): the request as the service
hands it, and the sequence that turns the tokens it picks into events: its sampler, text
decoder, stop strings, grammar matcher, max_tokens and timings, and where its tokens stand in the
KV cache (the batch schedules it from those)."""
import time
from dataclasses import dataclass

from worker.engine.choice import selection
from worker.engine.generation import Event, Timings
from worker.engine.grammar import Constraint
from worker.engine.sampling import Sampler, SamplingParams, StopMatcher
from worker.engine.tokenizer import StreamDecoder

NO_TIMINGS = Timings()     # token events carry none (the last event does), shared: Timings() costs microseconds


@dataclass(frozen=True)
class Request:
    """One generation, as the service hands it to the engine."""
    ids: list[int]                  # prompt tokens
    params: SamplingParams          # already filled with the model's defaults
    logprobs: int | None = None
    constraint: dict | None = None  # response_format / forced tool call (worker/engine/grammar.py)


class Sequence:
    """One generation inside a Batch. `tag` is the caller's; `done` once its last event (the one
    with finish_reason) has been returned."""

    def __init__(self, request: Request, tag, engine, matcher: Constraint | None):
        self.request, self.tag, self.matcher = request, tag, matcher
        self.done = False
        self.ending: str | None = None      # the finish reason it ends with at the next step (Batch.end)
        self.failed: Exception | None = None   # its grammar's error while its pass was written: it ends with it
        self.tokens = list(request.ids)     # the prompt, then every generated token kept
        self.written = 0                    # tokens whose K/V are in the cache
        self.slot, self.blocks = None, None
        self.sampler = Sampler(request.params, engine.config.vocab_size, engine.tokenizer.eog_ids)
        self.decoder, self.stops = StreamDecoder(engine.tokenizer), StopMatcher(request.params.stop)
        self._eog, self._n_ctx = engine.tokenizer.eog_ids, engine.n_ctx
        # what this sequence needs from the GPU; logprobs take alternatives from the top-k
        self.select = "topk" if request.logprobs is not None else selection(request.params)
        self.generated, self.matched_stop = 0, False
        self.added = time.perf_counter()
        self.admitted = self.first_token_at = None

    @property
    def admitted_now(self) -> bool:
        return self.slot is not None

    @property
    def last_position(self) -> int:
        """The last position a pass computes for it: the one whose logits give its last token
        (max_tokens or the context reached; it may end before, on a stop)."""
        return min(len(self.request.ids) + self.request.params.max_tokens, self._n_ctx) - 2

    def take(self, token: int, logprobs, now: float) -> tuple[Event | None, str | None]:
        """The token picked for it: its event (None for end of generation) and the finish
        reason when it ends here, as Engine.generate ends a generation."""
        self.generated += 1
        self.first_token_at = self.first_token_at or now
        if token in self._eog and not self.request.params.ignore_eos:
            return None, "stop"
        self.tokens.append(token)
        if self.matcher is not None:
            self.matcher.accept(token)
        armed = self.request.params.stops_armed(self.generated)
        text, self.matched_stop = self.stops.push(self.decoder.push(token), armed)
        event = Event(text, token, timings=NO_TIMINGS, logprobs=logprobs)
        if self.matched_stop:
            return event, "stop"
        if self.generated >= self.request.params.max_tokens or len(self.tokens) >= self._n_ctx:
            return event, "length"
        return event, None

    def last_event(self, reason: str, error: Exception | None = None) -> Event:
        """Its last event: the text held back as a possible start of a stop string (unless one
        matched), the finish reason (with `error`, "error") and the timings; it is then done."""
        self.done = True
        armed = self.request.params.stops_armed(self.generated)
        tail = "" if self.matched_stop else self.stops.push(self.decoder.flush(), armed)[0] + self.stops.flush()
        return Event(tail, None, reason, self.timings(), error=error)

    def timings(self) -> Timings:
        """Its timings until now (its last event's; the service's, for a job failed while its
        sequence was in the batch)."""
        now = time.perf_counter()
        first = self.first_token_at or now
        return Timings(prompt_tokens=len(self.request.ids), generated_tokens=self.generated,
                       prompt_seconds=first - (self.admitted or now), generation_seconds=now - first,
                       time_to_first_token=first - self.added)
