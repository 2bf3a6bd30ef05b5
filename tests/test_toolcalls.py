"""Tool calls in generated text: the format chosen from real chat templates (llama.cpp's
models/templates/), and the parser fed the text in pieces as a generation streams it."""
import json
import random

import gguf
import pytest

from worker.engine.toolcalls import ToolCallParser, format_for

HERMES_TEMPLATES = ["Qwen-Qwen2.5-7B-Instruct", "Qwen-Qwen3-0.6B", "Qwen-QwQ-32B",
                    "NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use", "NousResearch-Hermes-3-Llama-3.1-8B-tool_use"]
# templates without tools, or with another format (XML parameters, Llama's JSON, Mistral's [TOOL_CALLS])
OTHER_TEMPLATES = ["google-gemma-2-2b-it", "Qwen3-Coder", "GLM-4.6", "meta-llama-Llama-3.1-8B-Instruct",
                   "mistralai-Mistral-Nemo-Instruct-2407", "microsoft-Phi-3.5-mini-instruct"]


@pytest.mark.parametrize("name", HERMES_TEMPLATES)
def test_hermes_templates_choose_the_hermes_parser(name, llama_cpp_models):
    assert format_for((llama_cpp_models / "templates" / f"{name}.jinja").read_text()).name == "hermes"


@pytest.mark.parametrize("name", OTHER_TEMPLATES)
def test_other_templates_choose_none(name, llama_cpp_models):
    assert format_for((llama_cpp_models / "templates" / f"{name}.jinja").read_text()) is None


def test_smollm2_and_no_template_parse_nothing(smollm2_path):
    assert format_for(gguf.GGUFReader(smollm2_path).fields["tokenizer.chat_template"].contents()) is None
    assert format_for(None) is None


def parse(template_text, text, seed=0) -> tuple[str, list[dict]]:
    """Feed text in random pieces; the content streamed out plus what finish gives back."""
    parser, rng, out, at = ToolCallParser(format_for(template_text)), random.Random(seed), [], 0
    while at < len(text):
        step = rng.randint(1, 6)
        out.append(parser.push(text[at:at + step]))
        at += step
    held, calls = parser.finish()
    return "".join(out) + held, calls


@pytest.fixture(scope="module")
def qwen(llama_cpp_models):
    return (llama_cpp_models / "templates" / "Qwen-Qwen2.5-7B-Instruct.jinja").read_text()


@pytest.mark.parametrize("seed", range(5))
def test_calls_after_text_are_parsed_in_any_pieces(qwen, seed):
    text = ('Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Zürich"}}\n</tool_call>\n'
            '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>')
    content, calls = parse(qwen, text, seed)
    assert content == "Let me check.\n"
    assert [c["function"]["name"] for c in calls] == ["get_weather", "get_time"]
    assert [json.loads(c["function"]["arguments"]) for c in calls] == [{"city": "Zürich"}, {}]
    assert all(c["type"] == "function" and c["id"].startswith("call_") for c in calls)
    assert calls[0]["id"] != calls[1]["id"]


def test_a_call_cut_before_its_end_tag_is_still_a_call(qwen):
    content, calls = parse(qwen, '<tool_call>\n{"name": "f", "arguments": {"x": [1, 2]}}\n')
    assert content == "" and json.loads(calls[0]["function"]["arguments"]) == {"x": [1, 2]}


@pytest.mark.parametrize("text", [
    "Use <tool_call> tags to call tools.",               # prose naming the tag
    '<tool_call>\n{"name": "f", "arguments": {"x": 1\n',  # cut inside the JSON
    '<tool_call>\n{"arguments": {}}\n</tool_call>',       # no name
    '<tool_call>\n{"name": "f"}\n</tool_call> and then some words',
])
def test_what_does_not_parse_as_calls_is_content(qwen, text):
    assert parse(qwen, text) == (text, [])


def test_text_without_a_call_passes_through_whole(qwen):
    assert parse(qwen, "A < B and <tool is not a call <tool_c") == ("A < B and <tool is not a call <tool_c", [])


@pytest.mark.parametrize("seed", range(3))
def test_first_only_is_complete_at_the_first_end_tag_and_keeps_that_call(qwen, seed):
    """parallel_tool_calls false: complete once the first block closes and parses (not before),
    and finish answers that call alone, whatever follows it."""
    first = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
    text = first + '\n<tool_call>\n{"name": "get_ti'
    parser, rng, at, complete_at = ToolCallParser(format_for(qwen), first_only=True), random.Random(seed), 0, None
    while at < len(text):
        step = rng.randint(1, 6)
        assert parser.push(text[at:at + step]) == ""
        at += step
        if complete_at is None and parser.complete:
            complete_at = at
    assert len(first) <= complete_at < len(first) + 6
    held, calls = parser.finish()
    assert held == "" and [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] \
        == [("get_weather", {"city": "Oslo"})]


def test_first_only_is_not_complete_at_a_block_that_is_no_call(qwen):
    parser = ToolCallParser(format_for(qwen), first_only=True)
    text = '<tool_call>\n{"arguments": {}}\n</tool_call>'
    parser.push(text)
    assert not parser.complete and parser.finish() == (text, [])
