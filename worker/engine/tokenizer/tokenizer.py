"""Text <-> token ids for a GGUF model, matching llama.cpp id for id.

Decoding follows llama-cpp-python's `Llama.detokenize`: the concatenated pieces of
`llama_token_to_piece(special=False)`, so control and unknown tokens (BOS, <|im_end|>, ...)
render as nothing, and one leading space is dropped when the ids start with BOS (what
SentencePiece's space prefix put there; with byte-level BPE that space was the text's own, so
decode prompt ids without their BOS when that matters). llama.cpp's own `clean_spaces` pass is
not applied, as llama-cpp-python does not apply it either.
"""
from vkllm.errors import VkllmError
from worker.engine.tokenizer.bpe import ByteLevelBPE, byte_decode
from worker.engine.tokenizer.spm import SPACE, SentencePiece
from worker.engine.tokenizer.vocab import (
    BYTE,
    CONTROL,
    NORMAL,
    UNKNOWN,
    USER_DEFINED,
    Vocab,
)


class Tokenizer:
    def __init__(self, vocab: Vocab):
        self.vocab = vocab
        if vocab.model == "gpt2":
            self._model = ByteLevelBPE(vocab.token_to_id, list(vocab.merges), vocab.pre)
        else:
            self._model = SentencePiece(vocab.token_to_id, list(vocab.scores))
        # Parsed out of the text before tokenizing, longest (in bytes) first, as llama.cpp does.
        specials = [i for i, t in enumerate(vocab.types) if t in (CONTROL, USER_DEFINED, UNKNOWN)]
        specials.sort(key=lambda i: -len(vocab.tokens[i].encode()))
        self._specials = [(vocab.tokens[i], i, vocab.types[i] == USER_DEFINED) for i in specials]
        self._pieces: list[bytes | None] = [None] * len(vocab.tokens)

    @classmethod
    def from_metadata(cls, meta: dict) -> "Tokenizer":
        """meta: GGUF keys to plain Python values (strings, numbers, lists)."""
        return cls(Vocab.from_metadata(meta))

    @property
    def bos_id(self) -> int | None:
        return self.vocab.bos_id

    @property
    def eos_id(self) -> int | None:
        return self.vocab.eos_id

    @property
    def eog_ids(self) -> frozenset[int]:
        return self.vocab.eog_ids

    @property
    def vocab_size(self) -> int:
        return len(self.vocab.tokens)

    def encode(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        """add_special adds BOS/EOS as the model's metadata asks; parse_special turns the text
        of control tokens (like <|im_start|>) into those tokens. User-defined tokens are
        always parsed, as in llama.cpp."""
        v = self.vocab
        ids = [v.bos_id] if add_special and v.add_bos else []
        prev_special = True
        for fragment in self._partition(text, parse_special):
            if isinstance(fragment, int):
                ids.append(fragment)
                prev_special = True
                continue
            if v.model == "llama" and v.add_space_prefix and prev_special:
                fragment = " " + fragment
            ids.extend(self._model.encode(fragment))
            prev_special = False
        if add_special and v.add_eos:
            ids.append(v.eos_id)
        return ids

    def _partition(self, text: str, parse_special: bool) -> list[str | int]:
        fragments: list[str | int] = [text] if text else []
        for special, tid, user_defined in self._specials:
            if (not parse_special and not user_defined) or special not in text:
                continue
            split: list[str | int] = []
            for fragment in fragments:
                if isinstance(fragment, int):
                    split.append(fragment)
                    continue
                for k, part in enumerate(fragment.split(special)):
                    if k:
                        split.append(tid)
                    if part:
                        split.append(part)
            fragments = split
        return fragments

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes this token adds to decoded text (empty for control tokens)."""
        if not 0 <= token_id < len(self._pieces):
            raise VkllmError(f"token id {token_id} is outside the vocabulary (size {len(self._pieces)})")
        piece = self._pieces[token_id]
        if piece is None:
            piece = self._pieces[token_id] = self._piece(token_id)
        return piece

    def _piece(self, token_id: int) -> bytes:
        text, kind = self.vocab.tokens[token_id], self.vocab.types[token_id]
        if kind == USER_DEFINED:
            return text.encode()
        if kind == NORMAL:
            return byte_decode(text) if self.vocab.model == "gpt2" else text.replace(SPACE, " ").encode()
        if kind == BYTE:
            return bytes((int(text[3:5], 16),))
        return b""  # control, unknown, unused

    def token_text(self, token_id: int) -> str:
        """The token as a prompt would spell it: control tokens give their text ('<|im_end|>'),
        like llama.cpp's token_to_piece(special=True). For chat templates' bos/eos_token."""
        piece = self.token_bytes(token_id)
        if self.vocab.types[token_id] in (CONTROL, UNKNOWN):
            return self.vocab.tokens[token_id]
        return piece.decode("utf-8", errors="replace")

    def decode_bytes(self, ids: list[int]) -> bytes:
        out = b"".join(self.token_bytes(i) for i in ids)
        if ids and ids[0] == self.vocab.bos_id and out[:1] == b" ":
            out = out[1:]
        return out

    def decode(self, ids: list[int]) -> str:
        return self.decode_bytes(ids).decode("utf-8", errors="replace")
