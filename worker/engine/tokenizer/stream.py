"""Incremental detokenization for streaming: text goes out only once its UTF-8 is complete."""
import codecs

from worker.engine.tokenizer.tokenizer import Tokenizer


class StreamDecoder:
    """Feeds token ids one by one; the pieces joined (with `flush`) equal `tokenizer.decode(ids)`,
    less a character the ids end inside.

    A token may end in the middle of a multi-byte character (byte-fallback and byte-level
    tokens split emoji and CJK); those bytes wait for the token that completes them.
    """

    def __init__(self, tokenizer: Tokenizer):
        self._tokenizer = tokenizer
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._first = True
        self._strip_space = False

    def push(self, token_id: int) -> str:
        data = self._tokenizer.token_bytes(token_id)
        if self._first:
            self._first = False
            self._strip_space = token_id == self._tokenizer.bos_id
        if self._strip_space and data:
            # decode() drops one leading space after BOS; do the same on the first bytes.
            self._strip_space = False
            data = data[1:] if data[:1] == b" " else data
        return self._utf8.decode(data)

    def flush(self) -> str:
        """The end of the text. A character the generation ended inside (max_tokens, a cancel)
        is left out, as vLLM's and llama.cpp server's output ends with whole characters; its
        tokens still count. Bytes held back that no continuation makes valid (ED A0, a
        surrogate's start: the decoder holds those too) are U+FFFD, as they would be mid-text:
        Python's decoder spells a character's unfinished start as one U+FFFD, those as more."""
        held = self._utf8.getstate()[0]
        self._utf8.reset()
        text = held.decode("utf-8", errors="replace")
        return "" if text == "\ufffd" else text
