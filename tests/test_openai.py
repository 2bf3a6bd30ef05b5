"""The OpenAI-compatible endpoints, driven by the official `openai` client over real HTTP."""
import codecs
import json
import subprocess
import sys
import time

import openai
import pytest

from tests.conftest import openai_client
from tests.test_api import AUTH, submit, wait
from tests.test_length_cut_text import CONSTRAINT, WRITTEN

TOO_MANY_ITEMS = "parser error: Too many items (limit 50000; ff_tokens); try avoiding single-byte/short lexemes"


@pytest.fixture(scope="module")
def worker(start_worker):
    return start_worker("openai-w1")


@pytest.fixture(scope="module")
def oai(live_url, worker):
    return openai_client(live_url, 300)


def test_models(oai):
    assert "tiny-llama" in [m.id for m in oai.models.list().data]


def test_model_retrieve(oai):
    """client.models.retrieve (GET /v1/models/{id}) gives the listing's entry; an unknown id is
    OpenAI's 404 model_not_found."""
    listed = next(m for m in oai.models.list().data if m.id == "tiny-llama")
    got = oai.models.retrieve("tiny-llama")
    assert got.model_dump() == listed.model_dump() and got.object == "model" and got.context_length == 256
    with pytest.raises(openai.NotFoundError) as e:
        oai.models.retrieve("no-such-model")
    assert e.value.body["code"] == "model_not_found" and e.value.body["param"] == "model"


def test_completion_whole_and_streamed_agree(oai):
    whole = oai.completions.create(model="tiny-llama", prompt="Once upon", max_tokens=5, temperature=0)
    assert whole.object == "text_completion" and whole.choices[0].finish_reason == "length"
    assert whole.usage.completion_tokens == 5 and whole.usage.prompt_tokens > 0
    assert whole.usage.total_tokens == whole.usage.prompt_tokens + 5
    chunks = list(oai.completions.create(model="tiny-llama", prompt="Once upon", max_tokens=5, temperature=0,
                                         stream=True))
    assert "".join(c.choices[0].text for c in chunks) == whole.choices[0].text   # greedy: same text
    assert chunks[-1].choices[0].finish_reason == "length"


def test_completion_of_several_prompts(oai):
    """prompt as a list of strings, as LangChain's OpenAI LLM batches its prompts: n choices per
    prompt, prompt after prompt, each the answer the prompt alone gets; usage sums the prompts."""
    prompts = ["Once upon", "The cat sat on the"]
    singles = [oai.completions.create(model="tiny-llama", prompt=p, max_tokens=4, temperature=0) for p in prompts]
    both = oai.completions.create(model="tiny-llama", prompt=prompts, max_tokens=4, temperature=0, n=2)
    assert [c.index for c in both.choices] == [0, 1, 2, 3]
    assert [c.text for c in both.choices] == [s.choices[0].text for s in singles for _ in range(2)]
    assert both.usage.prompt_tokens == sum(s.usage.prompt_tokens for s in singles)
    assert both.usage.completion_tokens == 2 * sum(s.usage.completion_tokens for s in singles)
    chunks = list(oai.completions.create(model="tiny-llama", prompt=prompts, max_tokens=4, temperature=0, n=2,
                                         stream=True, stream_options={"include_usage": True}))
    texts = {}
    for chunk in chunks:
        for choice in chunk.choices:
            texts[choice.index] = texts.get(choice.index, "") + choice.text
    assert texts == {c.index: c.text for c in both.choices}
    assert chunks[-1].usage == both.usage
    for bad in (["Once", 7], [[1, 2], [3]], ["x"] * 65):
        with pytest.raises(openai.BadRequestError, match="a list of at most 64 strings") as e:
            oai.completions.create(model="tiny-llama", prompt=bad, max_tokens=2)
        assert e.value.body["param"] == "prompt"


def test_chat_whole_and_streamed_agree(oai):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    whole = oai.chat.completions.create(model="tiny-llama", messages=messages, max_tokens=5, temperature=0)
    assert whole.object == "chat.completion" and whole.choices[0].message.role == "assistant"
    assert whole.usage.completion_tokens <= 5
    stream = oai.chat.completions.create(model="tiny-llama", messages=messages, max_tokens=5, temperature=0,
                                         stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens


def test_an_answer_cut_inside_a_character_ends_before_it(oai, client):
    """max_tokens reached inside an emoji (tests/test_length_cut_text.py's grammar has the tiny
    model write it byte by byte): the answer, its streamed chunks and the job's output end before
    that character, where they ended with U+FFFD; usage counts every token. Reference: the
    tokens' own bytes (logprobs), decoded by Python with the cut character left out."""
    schema_format = {"type": "json_schema", "json_schema": {"name": "v", "schema": CONSTRAINT["schema"]}}
    for max_tokens in (3, 9):
        ask = dict(model="tiny-llama", messages=[{"role": "user", "content": "Say it:"}], max_tokens=max_tokens,
                   temperature=0, logprobs=True, response_format=schema_format)
        whole = oai.chat.completions.create(**ask)
        written = b"".join(bytes(t.bytes) for t in whole.choices[0].logprobs.content)
        expected = written.decode("utf-8", errors="ignore")
        assert WRITTEN.startswith(written) and expected.encode() != written   # the case at hand
        assert whole.choices[0].message.content == expected and whole.usage.completion_tokens == max_tokens
        assert whole.choices[0].finish_reason == "length"
        job = client.get(f"/api/v1/jobs/{whole.id.removeprefix('chatcmpl-')}", headers=AUTH).json
        assert job["output"] == expected
        chunks = [c for c in oai.chat.completions.create(**ask, stream=True) if c.choices]
        assert "".join(c.choices[0].delta.content or "" for c in chunks) == expected
        assert chunks[-1].choices[0].finish_reason == "length"


def test_errors_are_openai_errors(oai, live_url):
    with pytest.raises(openai.NotFoundError, match="unknown model"):
        oai.completions.create(model="no-such-model", prompt="x", max_tokens=2)
    with pytest.raises(openai.BadRequestError, match="temperature must be between"):
        oai.chat.completions.create(model="tiny-llama", messages=[{"role": "user", "content": "x"}],
                                    temperature=9)
    with pytest.raises(openai.BadRequestError, match="longer than the context"):
        oai.completions.create(model="tiny-llama", prompt="word " * 2000, max_tokens=2)
    bad_key = openai.OpenAI(base_url=f"{live_url}/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad_key.models.list()


@pytest.fixture(scope="module")
def smollm2(start_worker, smollm2_path, live_url):
    """An openai client for the appliance with a worker serving SmolLM2-135M-Instruct."""
    start_worker("openai-smollm2", model=smollm2_path)
    return openai_client(live_url, 600)


def test_real_model_answers_through_the_queue(smollm2):
    """SmolLM2-135M-Instruct, its own chat template, greedy: a fact the model knows."""
    client = smollm2
    answer = client.chat.completions.create(
        model="SmolLM2-135M-Instruct.Q4_1", max_tokens=12, temperature=0,
        messages=[{"role": "user", "content": "What is the capital of France?"}])
    assert "Paris" in answer.choices[0].message.content
    assert answer.choices[0].finish_reason == "stop"   # the model ended its turn itself
    # No sampling parameter: llama.cpp server's defaults (SmolLM2's GGUF recommends none), the
    # same tokens as a request that spells them out with the same seed.
    ask = {"model": "SmolLM2-135M-Instruct.Q4_1", "max_tokens": 12, "seed": 7,
           "messages": [{"role": "user", "content": "What is the capital of France?"}]}
    default = client.chat.completions.create(**ask)
    spelled_out = client.chat.completions.create(**ask, temperature=0.8, top_p=0.95,
                                                 extra_body={"top_k": 40, "min_p": 0.05, "repeat_penalty": 1.0})
    assert default.choices[0].message.content == spelled_out.choices[0].message.content


def completion_token(raw: bytes) -> str:
    """A token as OpenAI's completions API spells it: its text, or "bytes:\\xNN..." where its bytes
    are not whole UTF-8 characters."""
    try:
        return raw.decode()
    except UnicodeDecodeError:
        return "bytes:" + "".join(f"\\x{b:02x}" for b in raw)


def test_completion_logprobs_spell_partial_characters_as_bytes(smollm2, live_url):
    """SmolLM2 writes an emoji in byte tokens (one character, several tokens). As OpenAI's
    completions API, such a token is "bytes:\\xNN...", so its k alternatives stay k keys (all
    spelled U+FFFD they were one), and text_offset is where a token's bytes start in the text, in
    characters (it counted one per U+FFFD, past the text's end). Reference: the job's own token
    records (GET /api/v1/jobs/ID/stream), spelled here."""
    from urllib.request import Request, urlopen

    from tests.conftest import API_KEY
    from tests.test_api import sse_events
    ask = {"model": "SmolLM2-135M-Instruct.Q4_1", "prompt": "Emojis: \U0001F600\U0001F603\U0001F604\U0001F601",
           "max_tokens": 6, "temperature": 0, "logprobs": 5}
    answer = smollm2.completions.create(**ask)
    with urlopen(Request(f"{live_url}/api/v1/jobs/{answer.id.removeprefix('cmpl-')}/stream",
                         headers={"Authorization": f"Bearer {API_KEY}"}), timeout=60) as r:
        stream = r.read().decode()
    entries = [data["logprobs"] for _, kind, data in sse_events(stream) if kind == "token"]
    raws = [bytes(e["bytes"]) for e in entries]
    lp = answer.choices[0].logprobs
    assert lp.tokens == [completion_token(raw) for raw in raws]
    assert any(token.startswith("bytes:") for token in lp.tokens)   # the case at hand
    for top, entry in zip(lp.top_logprobs, entries, strict=True):
        assert top == {completion_token(bytes(t["bytes"])): t["logprob"] for t in entry["top_logprobs"]} | {
            completion_token(bytes(entry["bytes"])): entry["logprob"]}
        assert len(top) >= 5
    text = answer.choices[0].text
    assert text == b"".join(raws).decode()
    assert lp.text_offset == [len(b"".join(raws[:i]).decode("utf-8", "ignore")) for i in range(len(raws))]
    assert all(offset <= len(text) for offset in lp.text_offset)
    streamed = [c.choices[0].logprobs for c in smollm2.completions.create(**ask, stream=True) if c.choices[0].logprobs]
    assert [t for s in streamed for t in s.tokens] == lp.tokens
    assert [t for s in streamed for t in s.top_logprobs] == lp.top_logprobs
    assert [t for s in streamed for t in s.text_offset] == lp.text_offset


# --- messages, logprobs, n and seed (issue 12 points 1 and 4) ---


@pytest.fixture(scope="module")
def engine(vk_session, tiny_model):
    """The tiny model in this process: the reference the worker's answers are checked against."""
    from worker.engine.engine import Engine
    e = Engine.load(tiny_model, ctx=vk_session, max_batch=64)
    yield e
    e.close()


def log_softmax(logits):
    import numpy as np
    z = logits.astype(np.float64) - logits.max(axis=-1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


def reference(engine, prompt_text, max_tokens):
    """Greedy tokens (the GPU argmax path, no logprobs asked) and numpy's log-softmax rows for them."""
    from worker.engine.sampling import SamplingParams
    prompt = engine.tokenizer.encode(prompt_text)
    tokens = [e.token_id for e in engine.generate(prompt_text, SamplingParams(temperature=0, max_tokens=max_tokens))
              if e.token_id is not None]
    return tokens, log_softmax(engine.logits(prompt + tokens))[len(prompt) - 1:-1]


def assert_top(engine, pairs, row, k, spell=bytes):
    """pairs (token, logprob) are the k most likely tokens of the row: the k largest values, each
    that of a token spelled so (near ties may come in either order). spell: token bytes -> token."""
    import numpy as np
    assert len(pairs) == k
    np.testing.assert_allclose([v for _, v in pairs], np.sort(row)[::-1][:k], atol=1e-3)
    for token, value in pairs:
        assert token in [spell(engine.tokenizer.token_bytes(int(i)))
                         for i in np.flatnonzero(np.abs(row - value) < 1e-3)]


def assert_entry(engine, entry, token, row, top):
    assert bytes(entry.bytes) == engine.tokenizer.token_bytes(token)
    assert entry.logprob == pytest.approx(row[token], abs=1e-3)
    assert_top(engine, [(bytes(t.bytes), t.logprob) for t in entry.top_logprobs], row, top)


def test_chat_logprobs_agree_with_the_engines_log_softmax(oai, engine):
    messages = [{"role": "user", "content": "Tell me a story"}]
    tokens, rows = reference(engine, engine.render_chat(messages), 6)
    answer = oai.chat.completions.create(model="tiny-llama", messages=messages, max_tokens=6, temperature=0,
                                         logprobs=True, top_logprobs=3)
    content = answer.choices[0].logprobs.content
    assert len(content) == len(tokens) > 0
    for entry, token, row in zip(content, tokens, rows):
        assert_entry(engine, entry, token, row, 3)
    streamed = [e for c in oai.chat.completions.create(model="tiny-llama", messages=messages, max_tokens=6,
                                                       temperature=0, logprobs=True, top_logprobs=3, stream=True)
                if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content]
    assert [e.model_dump() for e in streamed] == [e.model_dump() for e in content]
    plain = oai.chat.completions.create(model="tiny-llama", messages=messages, max_tokens=6, temperature=0)
    assert plain.choices[0].logprobs is None and plain.choices[0].message.content == answer.choices[0].message.content


def test_completion_logprobs_agree_with_the_engines_log_softmax(oai, engine):
    import numpy as np
    tokens, rows = reference(engine, "Once upon", 5)
    answer = oai.completions.create(model="tiny-llama", prompt="Once upon", max_tokens=5, temperature=0, logprobs=2)
    lp = answer.choices[0].logprobs
    raws = [engine.tokenizer.token_bytes(t) for t in tokens]
    assert lp.tokens == [completion_token(raw) for raw in raws]
    np.testing.assert_allclose(lp.token_logprobs, rows[np.arange(len(tokens)), tokens], atol=1e-3)
    for top, row in zip(lp.top_logprobs, rows):   # a JSON object, in no order
        assert_top(engine, sorted(top.items(), key=lambda p: -p[1]), row, 2, spell=completion_token)
    utf8, chars = codecs.getincrementaldecoder("utf-8")(errors="replace"), [0]   # characters before each token
    for raw in raws:
        chars.append(chars[-1] + len(utf8.decode(raw)))
    assert lp.text_offset == chars[:-1]


def test_completion_top_logprobs_always_hold_the_sampled_token(oai, engine):
    """As OpenAI documents for completions (and vLLM does): each top_logprobs object holds the
    sampled token with its logprob besides the k most likely, up to k + 1 entries; logprobs: 0
    gives the sampled token alone. Sampled hot, so some tokens are not the most likely one."""
    import numpy as np
    from worker.engine.sampling import SamplingParams
    ask = {"temperature": 1.5, "top_k": 0, "top_p": 1.0, "min_p": 0.0, "seed": 3, "max_tokens": 8}
    prompt = engine.tokenizer.encode("Once upon")
    tokens = [e.token_id for e in engine.generate("Once upon", SamplingParams(**ask)) if e.token_id is not None]
    rows = log_softmax(engine.logits(prompt + tokens))[len(prompt) - 1:-1]
    texts = [completion_token(engine.tokenizer.token_bytes(t)) for t in tokens]
    assert any(row.argmax() != token for row, token in zip(rows, tokens))
    for k in (0, 1):
        request = {p: ask[p] for p in ("temperature", "top_p", "seed", "max_tokens")} | {
            "model": "tiny-llama", "prompt": "Once upon", "logprobs": k, "extra_body": {"top_k": 0, "min_p": 0.0}}
        lp = oai.completions.create(**request).choices[0].logprobs
        streamed = [top for c in oai.completions.create(**request, stream=True) if c.choices[0].logprobs
                    for top in c.choices[0].logprobs.top_logprobs]
        assert streamed == lp.top_logprobs
        assert lp.tokens == texts
        for top, token, text, row in zip(lp.top_logprobs, tokens, texts, rows):
            best = [completion_token(engine.tokenizer.token_bytes(int(i))) for i in np.argsort(-row)[:k]]
            assert sorted(top) == sorted(set(best + [text]))
            assert top[text] == pytest.approx(row[token], abs=1e-3)
            np.testing.assert_allclose([top[b] for b in best], np.sort(row)[::-1][:k], atol=1e-3)
        assert [top[text] for top, text in zip(lp.top_logprobs, lp.tokens)] == lp.token_logprobs


def test_content_parts_and_developer_and_tool_roles(oai, engine):
    def ask(messages):
        answer = oai.chat.completions.create(model="tiny-llama", messages=messages, max_tokens=4, temperature=0)
        return answer.choices[0].message.content, answer.usage.prompt_tokens

    parts = [{"role": "user", "content": [{"type": "text", "text": "Hello"}, {"type": "text", "text": "there"}]}]
    assert ask(parts) == ask([{"role": "user", "content": "Hello\nthere"}])
    # the tiny model's ChatML has no developer role: a developer message is a system message
    assert ask([{"role": "developer", "content": "Be kind."}, {"role": "user", "content": "Hi"}]) == \
        ask([{"role": "system", "content": "Be kind."}, {"role": "user", "content": "Hi"}])
    conversation = [{"role": "user", "content": "Weather?"},
                    {"role": "assistant", "content": None, "tool_calls": [
                        {"id": "call_1", "type": "function", "function": {"name": "weather", "arguments": "{}"}}]},
                    {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]
    _, prompt_tokens = ask(conversation)
    # ChatML spelled out: the call itself has no place in it, its result is a "tool" turn
    expected = ("<|im_start|>user\nWeather?<|im_end|>\n<|im_start|>assistant\n<|im_end|>\n"
                "<|im_start|>tool\nsunny<|im_end|>\n<|im_start|>assistant\n")
    assert prompt_tokens == len(engine.tokenizer.encode(expected))
    with pytest.raises(openai.BadRequestError, match=r"content\[0\] is a 'image_url' part"):
        oai.chat.completions.create(model="tiny-llama", max_tokens=2, messages=[{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "http://example.com/cat.png"}}]}])


def test_n_choices_are_the_seeded_single_runs(oai):
    ask = {"model": "tiny-llama", "messages": [{"role": "user", "content": "Go"}], "max_tokens": 8,
           "temperature": 1.0}
    two = oai.chat.completions.create(**ask, n=2, seed=11)
    assert [c.index for c in two.choices] == [0, 1]
    texts = [c.message.content for c in two.choices]
    # choice i is the request with seed 11 + i, so repeating it repeats every choice
    singles = [oai.chat.completions.create(**ask, seed=seed) for seed in (11, 12)]
    assert texts == [s.choices[0].message.content for s in singles]
    assert texts[0] != texts[1]
    assert two.usage.completion_tokens == sum(s.usage.completion_tokens for s in singles)
    assert two.usage.prompt_tokens == singles[0].usage.prompt_tokens
    assert two.usage.total_tokens == two.usage.prompt_tokens + two.usage.completion_tokens
    streamed = {0: "", 1: ""}
    finishes = {}
    for chunk in oai.chat.completions.create(**ask, n=2, seed=11, stream=True):
        for c in chunk.choices:
            streamed[c.index] += c.delta.content or ""
            finishes[c.index] = c.finish_reason or finishes.get(c.index)
    assert [streamed[0], streamed[1]] == texts
    assert finishes == {i: c.finish_reason for i, c in enumerate(two.choices)}
    completions = oai.completions.create(model="tiny-llama", prompt="Go", max_tokens=4, temperature=1.0, n=3, seed=4)
    assert [c.index for c in completions.choices] == [0, 1, 2] and completions.usage.completion_tokens > 0


def test_a_negative_seed_is_its_64_bit_twos_complement(oai, client):
    """OpenAI's API reference types seed as any int64 (-2^63 to 2^63 - 1), and clients send -1;
    a negative seed is the unsigned 64-bit seed C's cast makes of it (-3: 2^64 - 3), so it
    reproduces, and choice i of n draws with it + i as any seed's does. Past int64's range: 400."""
    ask = {"model": "tiny-llama", "messages": [{"role": "user", "content": "Go"}], "max_tokens": 8,
           "temperature": 1.0}
    negative = oai.chat.completions.create(**ask, seed=-3)
    unsigned = oai.chat.completions.create(**ask, seed=2**64 - 3)
    assert negative.choices[0].message.content == unsigned.choices[0].message.content
    two = oai.chat.completions.create(**ask, seed=-1, n=2)
    assert [c.message.content for c in two.choices] == [
        oai.chat.completions.create(**ask, seed=seed).choices[0].message.content for seed in (2**64 - 1, 0)]
    r = client.post("/v1/chat/completions", json=ask | {"seed": -2**63 - 1}, headers=AUTH)
    assert r.status_code == 400 and r.json == {"error": {
        "message": f"seed must be between {-2**63} and {2**64 - 1}, got {-2**63 - 1}", "type": "invalid_request_error",
        "param": "seed", "code": None}}


def test_a_grammar_failing_mid_generation_fails_its_request_alone(oai, client):
    """An object that must hold another such object: the tiny model's vocabulary lets its
    grammar start (so the request is queued), and the grammar library gives up a token later
    ("Too many items"). That error left the batch step, and the worker failed every job of the
    model with it; it now ends that generation alone (a 400 with the library's reason, its
    parser-state dump left out), and a job running beside it goes on to its end."""
    beside = submit(client, prompt="Once", max_tokens=240, ignore_eos=True, temperature=0)
    deadline = time.monotonic() + 120
    while client.get(f"/api/v1/jobs/{beside['id']}", headers=AUTH).json["progress"]["tokens"] == 0:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    schema = {"type": "object", "properties": {"a": {"$ref": "#"}}, "required": ["a"]}
    r = client.post("/v1/chat/completions", headers=AUTH, json={
        "model": "tiny-llama", "messages": [{"role": "user", "content": "x"}], "max_tokens": 20, "temperature": 0,
        "response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}}})
    assert r.status_code == 400 and r.json == {"error": {"message": TOO_MANY_ITEMS, "type": "invalid_request_error",
                                                         "param": None, "code": None}}
    job = wait(client, beside["id"])
    assert job["state"] == "finished" and job["usage"]["completion_tokens"] == 240


def test_user_and_metadata_are_accepted_and_metadata_is_kept_with_the_job(oai, client):
    """OpenAI's user and metadata: the job keeps metadata, as a REST job keeps its own (GET
    /api/v1/jobs/ID and the admin UI show it)."""
    answer = oai.chat.completions.create(model="tiny-llama", messages=[{"role": "user", "content": "Hi"}],
                                         max_tokens=2, user="user-42", metadata={"team": "search", "run": "7"})
    job = client.get(f"/api/v1/jobs/{answer.id.removeprefix('chatcmpl-')}", headers=AUTH).json
    assert job["metadata"] == {"team": "search", "run": "7"} and job["kind"] == "chat"
    plain = oai.completions.create(model="tiny-llama", prompt="Hi", max_tokens=2, user="user-42")
    assert client.get(f"/api/v1/jobs/{plain.id.removeprefix('cmpl-')}", headers=AUTH).json["metadata"] == {}


# --- tool calls (issue 12 points 1 and 3) ---

WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


@pytest.fixture(scope="module")
def smollm2_qwen_template(smollm2_path, llama_cpp_models, tmp_path_factory):
    """SmolLM2 with Qwen2.5's chat template (both ChatML; Qwen's adds the tools section and the
    Hermes <tool_call> format), written by gguf's own metadata tool."""
    out = tmp_path_factory.mktemp("tool-model") / "SmolLM2-qwen-template.gguf"
    subprocess.run([sys.executable, "-m", "gguf.scripts.gguf_new_metadata", "--force", "--chat-template-file",
                    str(llama_cpp_models / "templates" / "Qwen-Qwen2.5-7B-Instruct.jinja"), str(smollm2_path),
                    str(out)], check=True, capture_output=True)
    return out


def earlier_call(city: str, n: int) -> list[dict]:
    """A question and the get_weather call that answered it, as a chat's history has them."""
    return [{"role": "user", "content": f"What is the weather in {city}?"},
            {"role": "assistant", "content": None, "tool_calls": [{"id": f"call_{n}", "type": "function", "function": {
                "name": "get_weather", "arguments": json.dumps({"city": city})}}]}]


# two calls shown, then a third city asked for: SmolLM2 calls tools after such a history
SHOWN_CALLS = earlier_call("Paris", 1) + earlier_call("Rome", 2) + [
    {"role": "user", "content": "What is the weather in London?"}]


def test_tool_call_round_trip_with_a_real_model(start_worker, smollm2_qwen_template, live_url):
    """SmolLM2-135M, shown two calls earlier in the chat (it does not call tools unprompted),
    calls the tool for a third city; the client sends the call and its result back; the model
    answers in words. Greedy, so the streamed call is the same call."""
    start_worker("openai-tools", model=smollm2_qwen_template, n_ctx=1024)
    client = openai_client(live_url, 600)
    model = "SmolLM2-qwen-template"
    messages = list(SHOWN_CALLS)
    ask = {"model": model, "tools": [WEATHER_TOOL], "max_tokens": 40, "temperature": 0}
    answer = client.chat.completions.create(messages=messages, **ask)
    choice = answer.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.function.name == "get_weather" and call.id.startswith("call_")
    assert json.loads(call.function.arguments) == {"city": "London"}
    assert answer.usage.completion_tokens > 0

    calls, finish = {}, None
    for chunk in client.chat.completions.create(messages=messages, stream=True, **ask):
        delta = chunk.choices[0].delta
        assert not delta.content
        for part in delta.tool_calls or []:
            calls.setdefault(part.index, {"name": "", "arguments": ""})
            calls[part.index]["name"] += part.function.name or ""
            calls[part.index]["arguments"] += part.function.arguments or ""
        finish = chunk.choices[0].finish_reason or finish
    assert finish == "tool_calls"
    assert calls == {0: {"name": "get_weather", "arguments": call.function.arguments}}

    messages += [choice.message, {"role": "tool", "tool_call_id": call.id, "content": '{"temperature": 12}'}]
    final = client.chat.completions.create(messages=messages, **ask)
    assert final.choices[0].finish_reason == "stop" and not final.choices[0].message.tool_calls
    assert "12" in final.choices[0].message.content   # the tool's result reached the model
