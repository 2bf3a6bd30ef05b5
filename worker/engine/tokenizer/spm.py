"""SentencePiece-style tokenization (tokenizer.ggml.model = "llama"), as llama.cpp does it:
spaces become U+2581, then any adjacent pair whose concatenation is a vocabulary entry may
merge, highest score first; characters left without a token fall back to <0xNN> byte tokens."""
from vkllm.errors import VkllmError
from worker.engine.tokenizer.merge import merge_symbols

SPACE = "\u2581"


class SentencePiece:
    def __init__(self, token_to_id: dict[str, int], scores: list[float]):
        self._token_to_id = token_to_id
        self._scores = scores

    def encode(self, text: str) -> list[int]:
        ids: list[int] = []
        for sym in merge_symbols(list(text.replace(" ", SPACE)), self._priority):
            tid = self._token_to_id.get(sym)
            if tid is not None:
                ids.append(tid)
            else:
                ids.extend(self._byte_token(b) for b in sym.encode("utf-8", "surrogatepass"))
        return ids

    def _priority(self, left: str, right: str) -> float | None:
        tid = self._token_to_id.get(left + right)
        return None if tid is None else -self._scores[tid]

    def _byte_token(self, b: int) -> int:
        tid = self._token_to_id.get(f"<0x{b:02X}>")
        if tid is None and b < 0x80:
            tid = self._token_to_id.get(chr(b))
        if tid is None:
            raise VkllmError(f"the vocabulary has no byte token <0x{b:02X}> to spell an unknown character")
        return tid
