"""Token counts from the workers: POST /api/v1/tokenize, prompts too long for the context refused
up front by all three generation endpoints, the worker's counting thread, and the fallback when
no worker answers. References are counted here with the model file's own tokenizer and a chat
rendered by hand in ChatML (the tiny model's template)."""
import pytest
from redis import Redis
from rq.job import Job

from appliance import queue, schema
from tests.test_api import AUTH, submit, wait
from vkllm import protocol
from worker.engine.modelfile import ModelFile
from worker.engine.tokenizer import Tokenizer
from worker.service.tokenize import TokenCounter

N_CTX = 256   # what start_worker gives its workers (-c 256)


@pytest.fixture(scope="module")
def worker(start_worker):
    return start_worker("tokenize-w1")


@pytest.fixture(scope="module")
def reference(tiny_model):
    """Token count of a prompt, or of a chat rendered in ChatML, as llama.cpp would tokenize it."""
    meta = ModelFile.open(tiny_model).metadata
    assert meta["tokenizer.chat_template"].startswith("{% for message in messages %}{{'<|im_start|>'")
    tokenizer = Tokenizer.from_metadata(meta)

    def count(prompt=None, messages=None):
        if messages is not None:
            prompt = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
            prompt += "<|im_start|>assistant\n"
        return len(tokenizer.encode(prompt))
    return count


def words_for(reference, tokens: int) -> str:
    """The shortest "word word ..." prompt of at least `tokens` tokens."""
    k = 1
    while reference("word " * k) < tokens:
        k += 1
    return "word " * k


def tokenize(client, **body):
    return client.post("/api/v1/tokenize", json={"model": "tiny-llama"} | body, headers=AUTH)


@pytest.mark.parametrize("prompt", ["Hello", "Hello world, héllo ünïcode 日本語 🙂",
                                    "<|im_start|>user\nspecial tokens parse<|im_end|>", "word " * 300])
def test_tokenize_counts_as_the_tokenizer_does(client, worker, reference, prompt):
    r = tokenize(client, prompt=prompt)
    assert r.status_code == 200, r.json
    assert r.json == {"model": "tiny-llama", "tokens": reference(prompt), "n_ctx": N_CTX}


def test_tokenize_counts_a_chat_as_its_template_renders_it(client, worker, reference):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"},
                {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "Again"}]
    r = tokenize(client, messages=messages)
    assert r.status_code == 200 and r.json["tokens"] == reference(messages=messages)


@pytest.mark.parametrize("body,status,param", [
    ({"prompt": "x", "model": None}, 400, "model"),
    ({"prompt": "x", "model": "nope"}, 404, "model"),
    ({}, 400, "prompt"),
    ({"messages": [{"role": "robot", "content": "x"}]}, 400, "messages"),
])
def test_tokenize_validates(client, worker, body, status, param):
    r = tokenize(client, **body)
    assert r.status_code == status and r.json["error"]["param"] == param


def _jobs(client, redis_url) -> tuple[int, int]:
    """The jobs the API lists, and RQ's job hashes in Redis (a refused request creates neither; a
    job the worker took at once would have left its queue, not its hash)."""
    listed = client.get("/api/v1/jobs", headers=AUTH).json["total"]
    return listed, len(list(Redis.from_url(redis_url).scan_iter(f"{Job.redis_job_namespace_prefix}*")))


def test_a_prompt_that_fills_the_context_is_refused_by_every_endpoint(client, worker, reference, redis_url):
    prompt = words_for(reference, N_CTX)
    messages = [{"role": "user", "content": words_for(reference, N_CTX - 10)}]
    tokens, chat_tokens = reference(prompt), reference(messages=messages)
    assert len(prompt.encode()) < 8 * N_CTX   # under the byte bound: only the exact count refuses it
    before = _jobs(client, redis_url)
    for path, body, count in [("/api/v1/jobs", {"prompt": prompt}, tokens),
                              ("/api/v1/jobs", {"messages": messages}, chat_tokens),
                              ("/v1/completions", {"prompt": prompt}, tokens),
                              ("/v1/chat/completions", {"messages": messages}, chat_tokens)]:
        r = client.post(path, json={"model": "tiny-llama", "max_tokens": 2} | body, headers=AUTH)
        assert r.status_code == 400, (path, r.json)
        error = r.json["error"]
        assert error["code"] == "context_length_exceeded" and error["param"] == next(iter(body))
        assert error["message"] == (f"the prompt has {count} tokens; the context of tiny-llama is {N_CTX} tokens "
                                    f"and must also hold at least one generated token")
    assert _jobs(client, redis_url) == before


def test_one_token_less_is_accepted_and_the_worker_agrees(client, worker, reference):
    """The API's bound is the worker's own: a prompt leaving one token free runs to the context's end."""
    prompt = words_for(reference, N_CTX)
    prompt = prompt[:-len("word ")]
    assert reference(prompt) < N_CTX
    job = wait(client, submit(client, prompt=prompt, max_tokens=N_CTX)["id"])
    assert job["state"] == "finished", job["error"]
    assert job["usage"]["prompt_tokens"] == reference(prompt)


def test_count_tokens_is_none_when_no_worker_answers(app, redis_url):
    with app.app_context():
        assert queue.count_tokens("nobody-serves-this", prompt="Hello", timeout=0.3) is None
    # the unanswered request does not stay behind
    assert Redis.from_url(redis_url).ttl(protocol.tokenize_key("nobody-serves-this")) > 0


def test_counter_thread_counts_and_reports_template_errors(app, redis_url, tiny_model, vk_ctx, reference):
    """The worker's thread in this process, on a real engine: counts, the template's own refusal
    (as a 400 naming messages), and stop()."""
    from worker.engine.engine import Engine
    engine = Engine.load(tiny_model, n_ctx=64, ctx=vk_ctx, max_batch=16)
    counter = TokenCounter({"in-process": engine}, Redis.from_url(redis_url), poll_seconds=0.2)
    counter.start()
    try:
        with app.app_context():
            assert queue.count_tokens("in-process", prompt="Hello world") == reference("Hello world")
            engine.chat_template = "{{ raise_exception('Conversation roles must alternate') }}"
            with pytest.raises(schema.Invalid) as refused:
                schema.prompt_tokens("in-process", {"messages": [{"role": "user", "content": "x"}]})
            assert refused.value.param == "messages" and refused.value.status == 400
            assert "Conversation roles must alternate" in refused.value.message
    finally:
        counter.stop()
        counter.join(5)
        engine.close()
    assert not counter.is_alive()
