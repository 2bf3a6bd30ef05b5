"""A byte-level BPE vocabulary (GPT-2 style) of any size, for synthetic GGUF models.

The first 256 tokens are the bytes in GPT-2's byte-to-unicode spelling, so every text can be
tokenized; merges are learned from a short built-in text, so common English and code pieces
become single tokens; when a model needs more tokens than that text yields, further merges are
made by appending a letter to already-made tokens in a fixed order. The last tokens are the
ChatML control tokens. Everything is deterministic: same size, same vocabulary.
"""
import re
from collections import Counter
from dataclasses import dataclass

CONTROL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")

CHATML_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content']"
    " + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\\n' }}{% endif %}")

_TEXT = """\
The quick brown fox jumps over the lazy dog. A language model reads text as tokens and
predicts the next one. It was the best of times, it was the worst of times, it was the age of
wisdom, it was the age of foolishness. Hello, world! How are you today? I am fine, thank you.
In the beginning there was nothing, and then there was the word, and the word was good.
The weather is nice and the sun is shining, so we will go for a walk in the park this afternoon.
Numbers: 0 1 2 3 4 5 6 7 8 9 10 12 100 2024 3.14159 42 1000000.
def main():
    for i in range(10):
        print(f"value {i} is {i * i}")
    return 0

class Model:
    def __init__(self, config):
        self.config = config
        self.layers = [Layer(config) for _ in range(config.n_layer)]
if (x == 0) { return y + 1; } else { return x - 1; }
SELECT name, count(*) FROM users WHERE age > 30 GROUP BY name;
"""

_PRETOKENIZE = re.compile(r"'(?:[sdmt]|ll|ve|re)| ?[A-Za-z]+| ?[0-9]{1,3}| ?[^\sA-Za-z0-9]+|\s+(?!\S)|\s+")


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map (what gpt2 vocabularies spell in)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)]
    mapping = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in mapping:
            mapping[b] = chr(256 + extra)
            extra += 1
    return dict(sorted(mapping.items()))


@dataclass(frozen=True)
class Vocab:
    tokens: list[str]
    token_types: list[int]   # gguf.TokenType values: 1 normal, 3 control
    merges: list[str]

    def token_id(self, text: str) -> int:
        return self.tokens.index(text)


def _learn_merges(words: Counter, limit: int) -> list[tuple[str, str]]:
    merges = []
    words = Counter({tuple(w): n for w, n in words.items()})
    while len(merges) < limit:
        pairs = Counter()
        for word, n in words.items():
            for pair in zip(word, word[1:]):
                pairs[pair] += n
        if not pairs:
            break
        best = min(pairs, key=lambda p: (-pairs[p], p))
        if pairs[best] < 2:
            break
        merges.append(best)
        merged = Counter()
        for word, n in words.items():
            out, i = [], 0
            while i < len(word):
                if word[i:i + 2] == best:
                    out.append(best[0] + best[1])
                    i += 2
                else:
                    out.append(word[i])
                    i += 1
            merged[tuple(out)] += n
        words = merged
    return merges


def build_vocab(n_vocab: int) -> Vocab:
    """A vocabulary of exactly n_vocab tokens (n_vocab >= 256 + len(CONTROL_TOKENS))."""
    n_merges = n_vocab - 256 - len(CONTROL_TOKENS)
    if n_merges < 0:
        raise ValueError(f"vocabulary of {n_vocab} is smaller than the 256 bytes + control tokens")
    byte_chars = bytes_to_unicode()
    words = Counter("".join(byte_chars[b] for b in w.encode()) for w in _PRETOKENIZE.findall(_TEXT))
    merges = _learn_merges(words, n_merges)
    tokens = list(byte_chars.values()) + [a + b for a, b in merges]
    known = set(tokens)
    letters = [byte_chars[b] for b in b"etaoinsrhldcumfpgwybvkxjqz"]
    source = 256
    while len(merges) < n_merges:
        for letter in letters:
            if len(merges) == n_merges:
                break
            if tokens[source] + letter not in known:
                merges.append((tokens[source], letter))
                tokens.append(tokens[source] + letter)
                known.add(tokens[-1])
        source += 1
    tokens += CONTROL_TOKENS
    types = [1] * (len(tokens) - len(CONTROL_TOKENS)) + [3] * len(CONTROL_TOKENS)
    return Vocab(tokens, types, [f"{a} {b}" for a, b in merges])
