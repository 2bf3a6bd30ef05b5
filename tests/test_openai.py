"""The OpenAI-compatible endpoints, driven by the official `openai` client over real HTTP."""
import openai
import pytest

from tests.conftest import API_KEY


@pytest.fixture(scope="module")
def worker(start_worker):
    return start_worker("openai-w1")


@pytest.fixture(scope="module")
def oai(live_url, worker):
    return openai.OpenAI(base_url=f"{live_url}/v1", api_key=API_KEY, max_retries=0, timeout=300)


def test_models(oai):
    assert "tiny-llama" in [m.id for m in oai.models.list().data]


def test_completion_whole_and_streamed_agree(oai):
    whole = oai.completions.create(model="tiny-llama", prompt="Once upon", max_tokens=5, temperature=0)
    assert whole.object == "text_completion" and whole.choices[0].finish_reason == "length"
    assert whole.usage.completion_tokens == 5 and whole.usage.prompt_tokens > 0
    assert whole.usage.total_tokens == whole.usage.prompt_tokens + 5
    chunks = list(oai.completions.create(model="tiny-llama", prompt="Once upon", max_tokens=5, temperature=0,
                                         stream=True))
    assert "".join(c.choices[0].text for c in chunks) == whole.choices[0].text   # greedy: same text
    assert chunks[-1].choices[0].finish_reason == "length"


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


def test_real_model_answers_through_the_queue(start_worker, smollm2_path, live_url):
    """SmolLM2-135M-Instruct, its own chat template, greedy: a fact the model knows."""
    start_worker("openai-smollm2", model=smollm2_path)
    client = openai.OpenAI(base_url=f"{live_url}/v1", api_key=API_KEY, max_retries=0, timeout=600)
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
