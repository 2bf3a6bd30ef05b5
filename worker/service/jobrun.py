"""One RQ job inside the worker's batch: its request made into the engine's, its sequence's events
made into stream records (text, tool calls, logprobs), its progress and its result. No Redis
here: the worker sends the records (worker.service.outbox) and files the job with RQ."""
import time

from rq.executions import Execution
from rq.job import Job
from rq.queue import Queue
from rq.timeouts import JobTimeoutException

from vkllm import protocol, sampling_defaults
from vkllm.errors import VkllmError
from worker.engine.batch import Request
from worker.engine.generation import Event, Timings
from worker.engine.sampling import SamplingParams
from worker.engine.toolcalls import ToolCallParser, format_for


class JobRun:
    def __init__(self, job: Job, queue: Queue, execution: Execution):
        self.job, self.queue, self.execution = job, queue, execution
        self.stream, self.cancel_key = protocol.stream_key(job.id), protocol.cancel_key(job.id)
        self.started = time.monotonic()
        self.model = self.engine = self.seq = self.params = self.calls = None
        self.pieces, self.tool_calls, self.count = [], [], 0
        self.progress_at = 0.0      # monotonic time progress last went to job.meta
        self.cancelling = self.timed_out = False
        self.timings = Timings()
        self.finish = None
        self.result: dict | None = None
        self.exc_info = None        # (type, value, traceback) of a run that failed

    @property
    def ended(self) -> bool:
        return self.result is not None or self.exc_info is not None

    def join(self, engines: dict, request: dict) -> None:
        """The request joins its model's batch; a bad one raises (PromptTooLong, VkllmError,
        GrammarError, ...) and nothing joins."""
        model = request["model"]
        if model not in engines:
            raise VkllmError(f"model {model!r} is not loaded on this worker")
        engine = engines[model]
        params = SamplingParams(**sampling_defaults.fill(request["params"], engine.sampling_defaults))
        messages, tools = request.get("messages"), request.get("tools")
        prompt = engine.render_chat(messages, tools) if messages is not None else request["prompt"]
        # tool calls are parsed where the request offered tools and the template teaches a format
        fmt = format_for(engine.chat_template) if tools else None
        ids = engine.tokenizer.encode(prompt)
        self.seq = engine.batch.add(Request(ids, params, request.get("logprobs"), request.get("constraint")), tag=self)
        self.model, self.engine, self.params = model, engine, params
        # parallel_tool_calls false: the answer holds the first call only, so generation ends there
        self.calls = ToolCallParser(fmt, request.get("parallel_tool_calls") is False) if fmt else None

    def push(self, event: Event) -> list[dict]:
        """One event of the job's sequence: the stream records it makes (its last makes the end)."""
        text = self.calls.push(event.text) if self.calls else event.text
        if event.finish_reason is not None and self.calls:
            held, self.tool_calls = self.calls.finish()
            text += held
        logprobs = _logprobs(self.engine.tokenizer, event) if event.logprobs else None
        records = []
        if text or logprobs:
            self.pieces.append(text)
            records.append(protocol.record(protocol.TOKEN, text=text, **({"logprobs": logprobs} if logprobs else {})))
        if event.finish_reason is None:
            self.count += 1
            if self.calls and self.calls.complete:
                self.engine.batch.end(self.seq, "stop")
            return records
        self.finish, self.timings = event.finish_reason, event.timings
        if event.error is not None:   # its sequence failed alone (its grammar, min_tokens), its output kept
            self.fail_now(event.error)
            return records + [self.error_record()]
        if self.timed_out:
            self.fail_now(JobTimeoutException(f"the job ran past its timeout of {self.job.timeout} s"))
            return records + [self.error_record()]
        result = self.outcome()
        self.result = result
        return records + [protocol.record(protocol.END, **{k: v for k, v in result.items() if k != "text"})]

    def outcome(self) -> dict:
        t = self.timings
        prefilled = t.prefilled
        return {
            "text": "".join(self.pieces), "finish_reason": self.finish,
            "usage": {"prompt_tokens": t.prompt_tokens, "completion_tokens": t.generated_tokens},
            "timings": {"time_to_first_token": t.time_to_first_token if prefilled else None,
                        "prompt_tokens_per_second": t.prompt_tokens_per_second if prefilled else None,
                        "generation_tokens_per_second": t.generation_tokens_per_second},
            **({"tool_calls": self.tool_calls} if self.tool_calls else {}),
        }

    def progress(self) -> dict:
        return {"tokens": self.count, "max_tokens": self.params.max_tokens if self.params else None}

    def fail_now(self, error: BaseException) -> None:
        """End the run failed with this error (its traceback, if raised, is kept for RQ). A run
        whose sequence is still in the batch (a failed step, a stop) keeps its timings so far: a
        prompt prefilled, its first token out, counts in the metrics as a finished job's does."""
        self.exc_info = (type(error), error, error.__traceback__)
        if self.seq is not None and not self.seq.done:
            self.timings = self.seq.timings()

    def error_record(self) -> dict:
        error = self.exc_info[1]
        kind = "invalid_request" if isinstance(error, VkllmError) else "server_error"
        reason = (str(error) or type(error).__name__) if isinstance(error, Exception) else "the worker was shut down"
        return protocol.record(protocol.ERROR, error=reason, kind=kind)


def _logprobs(tokenizer, event) -> dict:
    """A token's logprobs as OpenAI's chat API spells them: text, log-probability, UTF-8 bytes."""
    def entry(token: int, logprob: float) -> dict:
        raw = tokenizer.token_bytes(token)   # empty for a control token: its text names it
        return {"token": raw.decode("utf-8", "replace") if raw else tokenizer.token_text(token),
                "logprob": logprob, "bytes": list(raw)}
    return entry(event.token_id, event.logprobs.logprob) | {
        "top_logprobs": [entry(token, logprob) for token, logprob in event.logprobs.top]}
