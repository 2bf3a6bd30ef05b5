"""Tool calls in generated text, in the format the model's chat template teaches it: a small
table of formats, one chosen from the template's text (as llama.cpp's server chooses its parser).
Generation streams through a ToolCallParser, which passes plain text on at once and holds
back what may be a call until the end, where the calls are parsed or, failing that, given back
as text. With first_only (OpenAI's parallel_tool_calls false) it keeps the first call only and
says once that call is complete, so that generation can end there."""
import json
import re
import uuid
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Format:
    name: str
    start: str
    end: str
    detect: re.Pattern   # found in a chat template that teaches this format
    parse: Callable[[str], tuple[str, object]]   # one call's body -> (function name, arguments)


def _hermes(body: str) -> tuple[str, object]:
    call = json.loads(body)
    if not isinstance(call, dict) or not isinstance(call.get("name"), str):
        raise ValueError("a tool call is a JSON object with a name")
    return call["name"], call.get("arguments", {})


# Hermes 2 Pro's format, taught by Qwen2.5, Qwen3, QwQ and Hermes templates:
# <tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>, one block per call.
FORMATS = (
    Format("hermes", "<tool_call>", "</tool_call>",
           re.compile(r'<tool_call>[\s\S]*\\?"arguments\\?"|\\?"arguments\\?"[\s\S]*<tool_call>'), _hermes),
)


def format_for(template: str | None) -> Format | None:
    """The tool-call format a chat template teaches; None when it teaches none this table knows."""
    return next((f for f in FORMATS if template and f.detect.search(template)), None)


class ToolCallParser:
    def __init__(self, fmt: Format, first_only: bool = False):
        self.fmt, self.first_only = fmt, first_only
        self._held = ""       # text that may start a call
        self._calls = None    # everything from the first call's start tag on, once seen
        self.complete = False   # first_only: the first call is whole and parses

    def _first_call(self) -> str | None:
        """first_only: the first call's block, start to end tag, once the end tag is out."""
        end = self._calls.find(self.fmt.end) if self.first_only and self._calls is not None else -1
        return self._calls[:end + len(self.fmt.end)] if end >= 0 else None

    def push(self, text: str) -> str:
        """The text that is plain content for sure; the rest is held."""
        if self._calls is not None:
            self._calls += text
            self._check_first()
            return ""
        buf = self._held + text
        at = buf.find(self.fmt.start)
        if at >= 0:
            self._held, self._calls = "", buf[at:]
            self._check_first()
            return buf[:at]
        keep = next((n for n in range(min(len(self.fmt.start) - 1, len(buf)), 0, -1)
                     if buf.endswith(self.fmt.start[:n])), 0)
        self._held = buf[len(buf) - keep:]
        return buf[:len(buf) - keep]

    def _check_first(self) -> None:
        block = None if self.complete else self._first_call()
        if block is not None:
            try:
                self.fmt.parse(block[len(self.fmt.start):-len(self.fmt.end)].strip())
                self.complete = True
            except ValueError:   # no call: generation goes on, and finish gives the text back as content
                pass

    def finish(self) -> tuple[str, list[dict]]:
        """(content still held, the tool calls as OpenAI spells them). Text that does not parse as
        calls, all of it, is content (a model that wrote the tag in prose). first_only: what follows
        a complete first call is dropped."""
        held, calls = self._held, self._first_call() if self.complete else self._calls
        self._held, self._calls = "", None
        if calls is None:
            return held, []
        try:
            return "", [_openai_call(*self.fmt.parse(body)) for body in self._bodies(calls)]
        except ValueError:
            return calls, []

    def _bodies(self, text: str) -> list[str]:
        """The bodies of the start..end blocks that make up all of text; the last block's end tag
        may be missing (generation stopped at it)."""
        bodies, rest = [], text.strip()
        while rest:
            if not rest.startswith(self.fmt.start):
                raise ValueError("text between tool calls")
            rest = rest[len(self.fmt.start):]
            body, _, rest = rest.partition(self.fmt.end)
            bodies.append(body.strip())
            rest = rest.strip()
        return bodies


def _openai_call(name: str, arguments) -> dict:
    if not isinstance(arguments, str):
        arguments = json.dumps(arguments, ensure_ascii=False)
    return {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
            "function": {"name": name, "arguments": arguments}}
