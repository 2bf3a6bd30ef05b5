"""Chat templates: SmolLM2's own template against the ChatML it spells out, it and real models'
templates (llama.cpp's models/templates/) against llama-cpp-python's Jinja2 formatter (goldens
from tests/tools/make_tokenizer_goldens.py), the fallback, and input validation."""
import json
from pathlib import Path

import gguf
import pytest

from vkllm.errors import VkllmError
from worker.engine.chat import encode_chat, render_chat
from worker.engine.tokenizer import Tokenizer

GOLDEN = Path(__file__).parent / "golden" / "tokenizer" / "smollm2_chat.json"
TEMPLATES_GOLDEN = json.loads((GOLDEN.parent / "chat_templates.json").read_text())["renders"]
LLAMA3_STYLE = Path(__file__).parent / "golden" / "tokenizer" / "bpe_llama-bpe_tiny.gguf"  # adds BOS
SMOL_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"


def tokenizer_of(path) -> Tokenizer:
    fields = gguf.GGUFReader(path).fields
    return Tokenizer.from_metadata({k: f.contents() for k, f in fields.items() if k.startswith("tokenizer.")})


@pytest.fixture(scope="module")
def smol_template(smollm2_path):
    return gguf.GGUFReader(smollm2_path).fields["tokenizer.chat_template"].contents()


def test_smollm2_template_adds_its_default_system_prompt(smol_template):
    prompt = render_chat(smol_template, [{"role": "user", "content": "Hi!"}])
    assert prompt == (f"<|im_start|>system\n{SMOL_SYSTEM}<|im_end|>\n"
                      "<|im_start|>user\nHi!<|im_end|>\n"
                      "<|im_start|>assistant\n")


def test_smollm2_template_keeps_a_given_system_prompt(smol_template):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"},
                {"role": "assistant", "content": "4"}]
    prompt = render_chat(smol_template, messages, add_generation_prompt=False)
    assert prompt == ("<|im_start|>system\nBe brief.<|im_end|>\n"
                      "<|im_start|>user\n2+2?<|im_end|>\n"
                      "<|im_start|>assistant\n4<|im_end|>\n")


def test_smollm2_template_matches_llama_cpp_python(smol_template):
    golden = json.loads(GOLDEN.read_text())
    for case in golden["renders"]:
        prompt = render_chat(smol_template, case["messages"], case["add_generation_prompt"],
                             bos_token="<|im_start|>", eos_token="<|im_end|>")
        assert prompt == case["prompt"]


@pytest.mark.parametrize("case", TEMPLATES_GOLDEN, ids=lambda c: c["template"])
def test_real_templates_match_llama_cpp_python(case, llama_cpp_models):
    template = (llama_cpp_models / "templates" / f"{case['template']}.jinja").read_text()
    args = (template, case["messages"], case["add_generation_prompt"], case["bos_token"], case["eos_token"])
    if "error" in case:
        with pytest.raises(VkllmError, match=case["error"]):
            render_chat(*args, **case["template_vars"])
    else:
        assert render_chat(*args, **case["template_vars"]) == case["prompt"]


def test_template_variables_reach_the_template():
    template = "{{ greeting }}{% if enable_thinking is defined and not enable_thinking %} /no_think{% endif %}"
    assert render_chat(template, [{"role": "user", "content": "x"}], greeting="hi", enable_thinking=False) == "hi /no_think"


def test_chatml_fallback_without_template():
    messages = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]
    assert render_chat(None, messages) == (
        "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\n")
    assert render_chat(None, messages, add_generation_prompt=False).endswith("U<|im_end|>\n")


def test_bos_eos_and_block_whitespace_as_transformers_renders_them():
    template = ("{{ bos_token }}{% for m in messages %}\n"
                "    {% if m.role == 'user' %}\n"
                "[INST] {{ m.content }} [/INST]\n"
                "    {% else %}\n"
                "{{ m.content }}{{ eos_token }}\n"
                "    {% endif %}\n"
                "{% endfor %}")
    messages = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]
    assert render_chat(template, messages, bos_token="<s>", eos_token="</s>") == "<s>[INST] a [/INST]\nb</s>\n"


def test_template_helpers():
    template = ("{% if messages[0].role != 'user' %}{{ raise_exception('first message must be from the user') }}"
                "{% endif %}{{ messages | tojson }} {{ strftime_now('%Y') | length }}")
    assert render_chat(template, [{"role": "user", "content": "é"}]) == '[{"role": "user", "content": "é"}] 4'
    with pytest.raises(VkllmError, match="first message must be from the user"):
        render_chat(template, [{"role": "system", "content": "x"}])


@pytest.mark.parametrize("template", [
    "{{ ''.__class__.__mro__ }}",                        # sandbox: no dunder access
    "{% set _ = messages.append({}) %}",               # immutable: no mutation of inputs
    "{% for m in messages %}",                           # syntax error
])
def test_unsafe_or_broken_templates_are_rejected(template):
    with pytest.raises(VkllmError, match="chat template"):
        render_chat(template, [{"role": "user", "content": "x"}])


@pytest.mark.parametrize("messages, message", [
    ([], "non-empty list"),
    ([{"role": "bot", "content": "x"}], r"messages\[0\].role must be one of system, developer, user, assistant, tool"),
    ([{"role": "user", "content": "x"}, {"content": "y"}], r"messages\[1\].role"),
    ([{"role": "user", "content": ["parts"]}], r"messages\[0\].content must be a string"),
    (["hello"], r"messages\[0\] must be an object"),
])
def test_bad_messages_are_rejected(messages, message):
    with pytest.raises(VkllmError, match=message):
        render_chat(None, messages)


def test_encode_chat_turns_markup_into_control_tokens(smollm2_path, smol_template):
    tok = tokenizer_of(smollm2_path)
    ids = encode_chat(tok, smol_template, [{"role": "user", "content": "Hi!"}])
    assert ids == tok.encode(render_chat(smol_template, [{"role": "user", "content": "Hi!"}]))
    assert ids[0] == 1 and ids.count(2) == 2          # <|im_start|> ... <|im_end|> twice
    assert ids[-4:] == [1] + tok.encode("assistant\n", add_special=False)


def test_encode_chat_writes_bos_once_when_the_tokenizer_adds_it():
    tok = tokenizer_of(LLAMA3_STYLE)
    assert tok.vocab.add_bos and tok.token_text(tok.bos_id) == "<|im_start|>"
    template = "{{ bos_token }}{% for m in messages %}[{{ m.content }}]{{ eos_token }}{% endfor %}"
    ids = encode_chat(tok, template, [{"role": "user", "content": "hello"}])
    eos = tok.eos_id
    assert ids == [tok.bos_id] + tok.encode("[hello]", add_special=False) + [eos]


WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}


def test_qwen25_template_gets_tools_calls_and_results(llama_cpp_models):
    """Qwen2.5's template with OpenAI's shapes: arguments arrive as a JSON string and reach the
    template as the object it writes with tojson; the expected prompt spelled out from Qwen's
    documented format (the tools section, <tool_call> and <tool_response> blocks)."""
    template = (llama_cpp_models / "templates" / "Qwen-Qwen2.5-7B-Instruct.jinja").read_text()
    messages = [{"role": "developer", "content": "Be brief."},
                {"role": "user", "content": "Weather in Paris?"},
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": "call_1", "type": "function",
                     "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": '{"temperature": 18}'}]
    tools_line = json.dumps(WEATHER, ensure_ascii=False)
    assert render_chat(template, messages, tools=[WEATHER]) == (
        "<|im_start|>system\nBe brief.\n\n# Tools\n\nYou may call one or more functions to assist with the user query."
        "\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
        f"{tools_line}\n</tools>\n\nFor each function call, return a json object with function name and arguments "
        "within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
        "<args-json-object>}\n</tool_call><|im_end|>\n"
        "<|im_start|>user\nWeather in Paris?<|im_end|>\n"
        '<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
        "<|im_end|>\n"
        '<|im_start|>user\n<tool_response>\n{"temperature": 18}\n</tool_response><|im_end|>\n'
        "<|im_start|>assistant\n")


def test_developer_is_system_where_the_template_has_no_developer_role(smol_template):
    system = render_chat(smol_template, [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}])
    assert render_chat(smol_template, [{"role": "developer", "content": "Be brief."},
                                       {"role": "user", "content": "Hi"}]) == system
    knows_developer = "{% for m in messages %}{{ m.role }}:{{ m.content }};{% endfor %}{# developer #}"
    assert render_chat(knows_developer, [{"role": "developer", "content": "x"}]) == "developer:x;"


def test_assistant_content_may_be_null_only_beside_tool_calls():
    with pytest.raises(VkllmError, match=r"messages\[0\].content must be a string"):
        render_chat(None, [{"role": "assistant", "content": None}])
    with pytest.raises(VkllmError, match="tool call arguments must be JSON"):
        render_chat(None, [{"role": "assistant", "content": None, "tool_calls": [
            {"type": "function", "function": {"name": "f", "arguments": "{oops"}}]}])


GEMMA3_TEMPLATE = (GOLDEN.parent / "google-gemma-3-it.jinja").read_text()   # google/gemma-3-*-it's


def test_gemma3_template_renders_gemma_turns():
    """Gemma's documented turn format: no system turn (the system text opens the first user
    turn), the assistant is `model`, each turn ends with <end_of_turn> and a newline."""
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"},
                {"role": "assistant", "content": "4"}, {"role": "user", "content": " And 3+3? "}]
    assert render_chat(GEMMA3_TEMPLATE, messages, bos_token="<bos>") == (
        "<bos><start_of_turn>user\nBe brief.\n\n2+2?<end_of_turn>\n"
        "<start_of_turn>model\n4<end_of_turn>\n"
        "<start_of_turn>user\nAnd 3+3?<end_of_turn>\n"
        "<start_of_turn>model\n")
    with pytest.raises(VkllmError, match="must alternate"):
        render_chat(GEMMA3_TEMPLATE, [{"role": "assistant", "content": "hi"}])


def test_gemma3_chat_encodes_turn_markers_as_control_tokens(gemma3_270m_path):
    """Through gemma-3-270m's own tokenizer: one BOS (the template writes it and the tokenizer
    adds it), and the turn markers as their single tokens."""
    tok = tokenizer_of(gemma3_270m_path)
    ids = encode_chat(tok, GEMMA3_TEMPLATE, [{"role": "user", "content": "Hi!"}])
    start, end = tok.encode("<start_of_turn>", add_special=False), tok.encode("<end_of_turn>", add_special=False)
    assert len(start) == 1 and len(end) == 1
    assert ids[0] == tok.bos_id and ids.count(tok.bos_id) == 1
    assert ids.count(start[0]) == 2 and ids.count(end[0]) == 1
    assert tok.decode(ids) == "user\nHi!\nmodel\n"     # control tokens decode to nothing


def test_generate_refuses_a_system_message_without_chat(tmp_path):
    """`vkllm generate --system S` without --chat dropped S without a word (only a chat has a
    system turn); it is now a usage error, before the model is opened."""
    import subprocess
    import sys

    from tests.conftest import VKLLM
    done = subprocess.run([sys.executable, "-c", VKLLM, "generate", "-m", str(tmp_path / "x.gguf"), "-p", "hi",
                           "--system", "be brief"], capture_output=True, text=True)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.splitlines()[-1] == "vkllm: error: --system is the system message of a chat: it needs --chat"
