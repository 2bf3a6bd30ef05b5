"""Byte-level BPE (tokenizer.ggml.model = "gpt2"): GPT-2's byte-to-char table, merge ranks."""
from worker.engine.tokenizer.merge import merge_symbols
from worker.engine.tokenizer.pretokenize import IGNORE_MERGES, PreTokenizer


def _byte_chars() -> list[str]:
    """GPT-2's table: printable Latin-1 bytes stand for themselves, the rest map to U+0100..."""
    keep = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    table = [""] * 256
    extra = 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


BYTE_CHARS = _byte_chars()
_ENCODE = str.maketrans({chr(b): c for b, c in enumerate(BYTE_CHARS)})
_DECODE = {c: b for b, c in enumerate(BYTE_CHARS)}


def byte_decode(text: str) -> bytes:
    """A vocabulary entry back to the bytes it stands for; chars outside the table pass as UTF-8."""
    return b"".join(bytes((_DECODE[c],)) if c in _DECODE else c.encode() for c in text)


class ByteLevelBPE:
    """Encodes raw text (no special tokens) to ids. Word results are cached: chat prompts and
    generated text repeat the same words over and over."""

    _CACHE_LIMIT = 1 << 16

    def __init__(self, token_to_id: dict[str, int], merges: list[str], pre: str):
        self._token_to_id = token_to_id
        self._ranks: dict[tuple[str, str], int] = {}
        for rank, merge in enumerate(merges):
            cut = merge.find(" ", 1)
            pair = (merge[:cut], merge[cut + 1:]) if cut >= 0 else ("", "")
            self._ranks.setdefault(pair, rank)
        self._pre = PreTokenizer(pre)
        self._ignore_merges = pre in IGNORE_MERGES
        self._cache: dict[str, list[int]] = {}

    def encode(self, text: str) -> list[int]:
        ids: list[int] = []
        for word in self._pre.split(text):
            cached = self._cache.get(word)
            if cached is None:
                if len(self._cache) >= self._CACHE_LIMIT:
                    self._cache.clear()
                cached = self._cache[word] = self._encode_word(word)
            ids.extend(cached)
        return ids

    def _encode_word(self, word: str) -> list[int]:
        encoded = word.encode("utf-8", "surrogatepass").decode("latin-1").translate(_ENCODE)
        if self._ignore_merges and encoded in self._token_to_id:
            return [self._token_to_id[encoded]]
        ids = []
        for sym in merge_symbols(list(encoded), self._rank):
            tid = self._token_to_id.get(sym)
            if tid is not None:
                ids.append(tid)
            else:
                # llama.cpp's fallback: look each UTF-8 byte of the symbol up as a one-byte token.
                ids.extend(self._token_to_id[chr(b)] for b in sym.encode()
                           if b < 0x80 and chr(b) in self._token_to_id)
        return ids

    def _rank(self, left: str, right: str) -> int | None:
        return self._ranks.get((left, right))
