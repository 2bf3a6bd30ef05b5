"""Chat templates: the model's Jinja2 template (tokenizer.chat_template) rendered the way
Hugging Face transformers renders it, in a sandbox since the template comes from a file."""
import json
from datetime import datetime
from functools import lru_cache

from jinja2 import TemplateError
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

from vkllm.errors import VkllmError
from worker.engine.tokenizer import Tokenizer

ROLES = ("system", "developer", "user", "assistant", "tool")

# transformers' default ChatML, for models that ship no template.
CHATML = ("{% for message in messages %}"
          "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
          "{% endfor %}"
          "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")


def render_chat(template: str | None, messages: list[dict], add_generation_prompt: bool = True,
                bos_token: str = "", eos_token: str = "", **template_vars) -> str:
    """The prompt text for `messages`; tokenize it with parse_special=True. template_vars are
    further variables some templates read, as transformers passes them (enable_thinking for
    Qwen3, date_string for Llama 3.x, tools)."""
    _validate(messages)
    messages = _as_template_expects(template or CHATML, messages)
    try:
        return _compile(template or CHATML).render(
            **template_vars, messages=messages, add_generation_prompt=add_generation_prompt,
            bos_token=bos_token, eos_token=eos_token)
    except (TemplateError, TypeError) as e:   # TypeError: the template adds a string to what is not one
        raise VkllmError(f"chat template failed: {e}") from None


def chat_prompt(tokenizer: Tokenizer, template: str | None, messages: list[dict],
                add_generation_prompt: bool = True, **template_vars) -> str:
    """Prompt text for a chat, built as llama.cpp's server builds it: the template gets the
    BOS/EOS token texts, and a BOS it writes first (or an EOS it writes last) is dropped when
    the tokenizer adds that token itself, so it is not there twice."""
    bos = tokenizer.token_text(tokenizer.bos_id) if tokenizer.bos_id is not None else ""
    eos = tokenizer.token_text(tokenizer.eos_id) if tokenizer.eos_id is not None else ""
    text = render_chat(template, messages, add_generation_prompt, bos_token=bos, eos_token=eos, **template_vars)
    if tokenizer.vocab.add_bos and bos and text.startswith(bos):
        text = text[len(bos):]
    if tokenizer.vocab.add_eos and eos and text.endswith(eos):
        text = text[:-len(eos)]
    return text


def encode_chat(tokenizer: Tokenizer, template: str | None, messages: list[dict],
                add_generation_prompt: bool = True, **template_vars) -> list[int]:
    """Prompt ids for a chat (see chat_prompt)."""
    text = chat_prompt(tokenizer, template, messages, add_generation_prompt, **template_vars)
    return tokenizer.encode(text, add_special=True, parse_special=True)


def _validate(messages: list[dict]) -> None:
    if not isinstance(messages, list) or not messages:
        raise VkllmError("messages must be a non-empty list of {role, content} objects")
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise VkllmError(f"messages[{i}] must be an object with role and content")
        if m.get("role") not in ROLES:
            raise VkllmError(f"messages[{i}].role must be one of {', '.join(ROLES)} (got {m.get('role')!r})")
        content = m.get("content")
        if not (isinstance(content, str) or (content is None and m["role"] == "assistant" and m.get("tool_calls"))):
            raise VkllmError(f"messages[{i}].content must be a string")


def _as_template_expects(template: str, messages: list[dict]) -> list[dict]:
    """OpenAI's messages in the shape chat templates read, as llama.cpp's server passes them: a
    developer message is a system message where the template knows no developer role, a tool
    call's arguments are an object (templates write them with tojson), not a JSON string, and
    the null content beside tool calls is "" (templates that know tool calls test it for
    truth; those that do not concatenate it)."""
    developer = "developer" in template
    return [m | {"role": "system" if m["role"] == "developer" and not developer else m["role"],
                 "content": m["content"] or ""}
            | ({"tool_calls": [_call_object(c) for c in m["tool_calls"]]} if m.get("tool_calls") else {})
            for m in messages]


def _call_object(call: dict) -> dict:
    function = call.get("function") or {}
    arguments = function.get("arguments")
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            raise VkllmError(f"tool call arguments must be JSON: {arguments!r}") from None
    return call | {"function": function | {"arguments": arguments}}


def _raise_exception(message: str):
    raise TemplateError(message)


def _tojson(value, indent=None, ensure_ascii=False, separators=None, sort_keys=False):
    # transformers overrides Jinja's tojson: no HTML escaping, non-ASCII kept as is.
    return json.dumps(value, indent=indent, ensure_ascii=ensure_ascii, separators=separators,
                      sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


@lru_cache(maxsize=16)
def _compile(template: str):
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    try:
        return env.from_string(template)
    except TemplateError as e:
        raise VkllmError(f"chat template does not parse: {e}") from None
