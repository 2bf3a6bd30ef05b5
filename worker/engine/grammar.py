"""Constrained generation: what a request allows the model to write, as a grammar whose token
mask the GPU applies before each selection (kernels/mask.py). The grammars are llguidance's
(a maintained library: JSON Schema and Lark grammars compiled to an Earley parser over the
tokenizer's own tokens); this module turns a request's constraint into one, hands llguidance the
engine's vocabulary, and steps a matcher along the generated tokens.

A constraint, as the request carries it (the web app checks its shape; the schema itself is
checked here, where the library is):
  {"type": "json_object"}                      any JSON object (OpenAI's JSON mode)
  {"type": "json_schema", "schema": {...}}     JSON valid under the schema
  {"type": "tool_call", "tools": [...], "name": None | str, "parallel": bool}
                                               one call (of `name`, when given) in the tool-call
                                               format the chat template teaches; with parallel
                                               (OpenAI's parallel_tool_calls) one or more
"""
import json

import llguidance
import numpy as np

from vkllm.errors import VkllmError
from worker.engine.toolcalls import Format

# Compact JSON with one space after separators, as json.dumps writes it. Without fixed
# whitespace a small model may fill its whole budget with newlines between two keys.
JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


class GrammarError(VkllmError):
    """A constraint the library cannot enforce (a schema keyword it does not implement, a bad
    schema); the message names what, and the request is refused."""


def lltokenizer(tokenizer, n_vocab: int) -> llguidance.LLTokenizer:
    """The engine's vocabulary as llguidance sees it: each id's bytes, tokens of no bytes (control
    tokens) by name after a 0xFF byte, llguidance's mark of special tokens (which text never
    spells, so a grammar allows them only as EOS), the end-of-generation ids as its EOS.
    `n_vocab`: the logits row's length (ids past the tokenizer's are never allowed)."""
    return llguidance.LLTokenizer(llguidance.TokenizerWrapper(_Vocabulary(tokenizer)), n_vocab=n_vocab,
                                  eos_token=sorted(tokenizer.eog_ids))


class _Vocabulary:
    """What llguidance's TokenizerWrapper reads of a tokenizer."""

    def __init__(self, tokenizer):
        # control, unknown and unused tokens add no bytes to the text: special to llguidance
        self.special_token_ids = [i for i in range(tokenizer.vocab_size) if not tokenizer.token_bytes(i)]
        self.tokens = [tokenizer.token_bytes(i) for i in range(tokenizer.vocab_size)]
        for i in self.special_token_ids:
            self.tokens[i] = b"\xff" + tokenizer.vocab.tokens[i].encode()
        self.eos_token_id = tokenizer.eos_id
        self.bos_token_id = tokenizer.bos_id
        self._tokenizer = tokenizer

    def __call__(self, text):
        if isinstance(text, bytes):   # the wrapper probes for bytes; this tokenizer takes text
            raise TypeError("text, not bytes")
        return self._tokenizer.encode(text, add_special=False, parse_special=False)


def grammar(constraint: dict, tool_format: Format | None) -> str:
    """The llguidance grammar of a constraint (see the module's docstring)."""
    kind = constraint.get("type")
    if kind == "json_object":
        return llguidance.LLMatcher.grammar_from_json_schema({"type": "object"}, overrides=JSON_OPTIONS)
    if kind == "json_schema":
        return llguidance.LLMatcher.grammar_from_json_schema(constraint["schema"], overrides=JSON_OPTIONS)
    if kind == "tool_call":
        if tool_format is None:
            raise GrammarError("this model's chat template teaches no tool-call format this server knows, so a "
                               "tool call cannot be required")
        return _tool_call_grammar(constraint["tools"], constraint.get("name"), tool_format,
                                  constraint["parallel"])
    raise GrammarError(f"unknown constraint type {kind!r}")


def _tool_call_grammar(tools: list[dict], name: str | None, fmt: Format, parallel: bool) -> str:
    """A call in the format's tags: {"name": one of the functions (`name` when given),
    "arguments": valid under its parameters}; with `parallel`, more calls may follow, each in
    its own tags on a new line (as the template writes several), and the model ends after any."""
    functions = [t["function"] for t in tools if name is None or t["function"]["name"] == name]
    if not functions:
        raise GrammarError(f"tool_choice names {name!r}, which is not among the tools")
    call = {"anyOf": [{"type": "object", "properties": {"name": {"const": f["name"]},
                                                        "arguments": f.get("parameters") or {"type": "object"}},
                       "required": ["name", "arguments"], "additionalProperties": False} for f in functions]}
    opening, closing = json.dumps(fmt.start + "\n"), json.dumps("\n" + fmt.end)
    body = json.dumps(call | {"x-guidance": JSON_OPTIONS})
    more = ' ("\\n" call)*' if parallel else ""
    lark = f"start: call{more}\ncall: {opening} body {closing}\nbody: %json {body}"
    return llguidance.LLMatcher.grammar_from_lark(lark)


def _reason(error: str) -> str:
    """llguidance's error in one line: without the dump of its parser state and grammar that it
    appends (tens of lines), and its stop reason for a grammar that allows no first token said
    plainly."""
    reason = error.split("<state>", 1)[0].strip()
    if reason == "NoExtensionBias":
        return ("the schema admits no JSON value: its grammar cannot start (such as a $ref to itself with no "
                "alternative)")
    return " ".join(reason.split())


class Constraint:
    """One generation's matcher: the mask for the next token, then the token taken."""

    def __init__(self, tokenizer: llguidance.LLTokenizer, grammar_text: str):
        self._matcher = llguidance.LLMatcher(tokenizer, grammar_text, log_level=0)
        self._check()

    def _check(self):
        if self._matcher.is_error():
            raise GrammarError(_reason(self._matcher.get_error()))

    def check_start(self):
        """Raises GrammarError if the grammar allows no first token (some vocabularies show that
        only when the first mask is computed), as a request is checked before it is queued."""
        self._matcher.compute_bitmask()
        self._check()

    def fill(self, words: np.ndarray):
        """Writes the next token's mask into words (uint32 [vocab / 32], e.g. host-visible memory)."""
        assert words.dtype == np.uint32 and words.flags["C_CONTIGUOUS"]
        self._matcher.unsafe_compute_mask_ptr(words.ctypes.data, words.nbytes)
        self._check()

    def accept(self, token: int):
        self._matcher.consume_token(token)
        self._check()
