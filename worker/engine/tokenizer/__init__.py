"""Tokenizers read from GGUF metadata: byte-level BPE and SentencePiece, as llama.cpp runs them."""
from worker.engine.tokenizer.stream import StreamDecoder
from worker.engine.tokenizer.tokenizer import Tokenizer

__all__ = ["StreamDecoder", "Tokenizer"]
