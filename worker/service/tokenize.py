"""Exact token counts for the web app, answered from a worker's thread.

The web app must not import the engine, so it cannot tokenize; to refuse a prompt longer than the
context before it becomes a job, it asks the workers over Redis (see protocol.tokenize_key). Any
worker serving the model answers, from a thread of its own beside the generation thread.

Sharing the model's tokenizer with the generation thread needs no lock: its caches (BPE words,
token pieces, compiled chat templates) are dicts, lists and lru_cache filled with values that do
not depend on which thread computes them, and each get, set or clear is atomic under the GIL."""
import json
import logging
import threading

from redis import Redis

from vkllm import protocol
from vkllm.errors import VkllmError
from worker.engine.grammar import GrammarError

log = logging.getLogger(__name__)


def count(engine, request: dict) -> dict:
    """The reply to one request: the prompt's length in tokens, encoded exactly as
    Engine.generate encodes it, or why a chat cannot become a prompt, or (param "constraint")
    why its constraint cannot be enforced."""
    try:
        messages = request.get("messages")
        text = engine.render_chat(messages, request.get("tools")) if messages is not None else request["prompt"]
        tokens = len(engine.tokenizer.encode(text))
    except VkllmError as e:
        return {"error": str(e)}
    if request.get("constraint") is not None:
        try:
            engine.constraint(request["constraint"]).check_start()
        except GrammarError as e:
            return {"error": str(e), "param": "constraint"}
    return {"tokens": tokens}


class TokenCounter(threading.Thread):
    """Pops requests for every model of the worker in turn (one BLPOP over their lists) and
    pushes each reply with a short expiry, until stop()."""

    def __init__(self, engines: dict, connection: Redis, poll_seconds: float = 1.0):
        super().__init__(name="vkllm-tokenize", daemon=True)
        self.engines, self.connection, self.poll_seconds = engines, connection, poll_seconds
        self.keys = {protocol.tokenize_key(name): name for name in engines}
        self._done = threading.Event()

    def run(self) -> None:
        while not self._done.is_set():
            try:
                popped = self.connection.blpop(list(self.keys), timeout=self.poll_seconds)
                if popped:
                    key, raw = popped
                    self.answer(self.keys[key.decode()], json.loads(raw))
            except Exception:   # a Redis hiccup or a malformed request must not end the thread
                log.exception("tokenize request failed")
                self._done.wait(self.poll_seconds)

    def answer(self, model: str, request: dict) -> None:
        reply = json.dumps(count(self.engines[model], request))
        with self.connection.pipeline() as pipe:
            pipe.rpush(request["reply"], reply)
            pipe.expire(request["reply"], protocol.TOKENIZE_REPLY_TTL)
            pipe.execute()

    def stop(self) -> None:
        """Tells the thread to end within one poll (join it to wait for that)."""
        self._done.set()
