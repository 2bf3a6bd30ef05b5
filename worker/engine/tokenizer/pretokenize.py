"""Pre-tokenizer regexes of byte-level BPE models, as llama.cpp applies them.

llama.cpp picks a list of regexes from `tokenizer.ggml.pre` and applies them one after the
other: each regex splits every piece left by the previous one, and the text between two
matches is kept as a piece of its own (it is never dropped). We copy the regexes from
llama-vocab.cpp. Two things differ from writing them with Python's `\\s`: llama.cpp's
whitespace is the Unicode White_Space set (no \\x1c-\\x1f), and the case-insensitive group
`(?i:'s|...)` is spelled out with character classes (as llama.cpp does) because Python folds
'ſ' to 's'.
"""
import regex

# Unicode White_Space, the set llama.cpp's unicode tables mark as whitespace.
_WS = "\t\n\x0b\x0c\r \x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000"
_S = f"[{_WS}]"
_NS = f"[^{_WS}]"
_CONTRACTIONS = "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"

GPT2 = rf"'s|'t|'re|'ve|'m|'ll|'d| ?\p{{L}}+| ?\p{{N}}+| ?[^{_WS}\p{{L}}\p{{N}}]+|{_S}+(?!{_NS})"


def _llama3_like(numbers: str) -> str:
    """Llama 3 and Qwen2 share one pattern; they differ in how many digits make a piece."""
    return (rf"{_CONTRACTIONS}|[^\r\n\p{{L}}\p{{N}}]?\p{{L}}+|{numbers}"
            rf"| ?[^{_WS}\p{{L}}\p{{N}}]+[\r\n]*|{_S}*[\r\n]+|{_S}+(?!{_NS})|{_S}+")


LLAMA3 = _llama3_like(r"\p{N}{1,3}")
QWEN2 = _llama3_like(r"\p{N}")

# gpt-4o's letter-case classes as llama.cpp rewrites them: any letter that is not a-z ("upper")
# or not A-Z ("lower"), so that letters other than ASCII count as both.
_UPPER = r"(?:(?=\p{L})[^a-z])"
_LOWER = r"(?:(?=\p{L})[^A-Z])"
GPT4O = (rf"[^\r\n\p{{L}}\p{{N}}]?{_UPPER}*{_LOWER}+{_CONTRACTIONS}?"
         rf"|[^\r\n\p{{L}}\p{{N}}]?{_UPPER}+{_LOWER}*{_CONTRACTIONS}?"
         rf"|\p{{N}}{{1,3}}| ?[^{_WS}\p{{L}}\p{{N}}]+[\r\n/]*|{_S}*[\r\n]+|{_S}+(?!{_NS})|{_S}+")

_DEFAULT = (r"[\p{P}\$\+<=>\^~\|]+", GPT2, r"\p{N}+", r"[0-9][0-9][0-9]")
_DIGITS_THEN_GPT2 = (r"\p{N}", GPT2)

# tokenizer.ggml.pre -> regexes, grouped as in llama-vocab.cpp.
PRE_TOKENIZERS: dict[str, tuple[str, ...]] = {
    "default": _DEFAULT,
    **dict.fromkeys(("llama3", "llama-v3", "llama-bpe", "falcon3", "dbrx", "smaug-bpe"), (LLAMA3,)),
    **dict.fromkeys(("qwen2", "deepseek-r1-qwen", "megrez", "stablelm2"), (QWEN2,)),
    **dict.fromkeys(("smollm", "starcoder", "refact", "codeshell", "command-r"), _DIGITS_THEN_GPT2),
    **dict.fromkeys(("gpt-2", "phi-2", "mpt", "olmo"), (GPT2,)),
    "gpt-4o": (GPT4O,),
}

# Pre-tokenizers whose whole-word vocabulary hits skip the merges (llama.cpp ignore_merges).
IGNORE_MERGES = frozenset(("llama3", "llama-v3", "llama-bpe", "falcon3"))
# Pre-tokenizers for which llama.cpp adds BOS unless tokenizer.ggml.add_bos_token says otherwise.
ADD_BOS_BY_DEFAULT = IGNORE_MERGES


class PreTokenizer:
    """Splits text into the words BPE merges within."""

    def __init__(self, name: str):
        self.name = name
        self._patterns = [regex.compile(p) for p in PRE_TOKENIZERS[name]]

    def split(self, text: str) -> list[str]:
        pieces = [text]
        for pattern in self._patterns:
            pieces = [part for piece in pieces for part in _split_keep_gaps(pattern, piece)]
        return pieces


def _split_keep_gaps(pattern: regex.Pattern, text: str) -> list[str]:
    out = []
    end = 0
    for m in pattern.finditer(text):
        if m.start() > end:
            out.append(text[end:m.start()])
        if m.end() > m.start():
            out.append(m.group())
        end = m.end()
    if end < len(text):
        out.append(text[end:])
    return out
