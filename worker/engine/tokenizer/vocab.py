"""The vocabulary as llama.cpp reads it from GGUF metadata: token types, special ids, the
add-BOS/EOS defaults per tokenizer model, and the end-of-generation set.

llama.cpp also recognises some special tokens by their text (GGUF files rarely list them all
by id) and forces those to be control tokens; we do the same so that both parse and render
them identically.
"""
from dataclasses import dataclass

from vkllm.errors import VkllmError
from worker.engine.tokenizer.pretokenize import ADD_BOS_BY_DEFAULT, PRE_TOKENIZERS

# tokenizer.ggml.token_type values
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6

_EOT_TEXTS = ("<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
              "<|end_of_text|>", "<EOT>", "_<EOT>", "[EOT]", "<｜end▁of▁sentence｜>",
              "<end_of_utterance>")
_FIM_TEXTS = ("<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>", "▁<PRE>",
              "<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<｜fim▁hole｜>", "<SUF>", "▁<SUF>",
              "<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>", "<MID>", "▁<MID>")
# FIM pad/repo/file-separator tokens end generation in llama.cpp.
_FIM_EOG_TEXTS = ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]",
                  "<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>",
                  "<|file_sep|>")
_EOG_TEXTS = ("<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
              "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
              "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
              "<｜end▁of▁sentence｜>", "[e~[")
# llama.cpp's exceptions: (token that is not EOG after all, its new type, tokens that say so)
_NOT_EOG = (("<|end|>", USER_DEFINED, ("<|return|>", "<|call|>")),  # gpt-oss
            ("<|end|>", USER_DEFINED, ("<|calls|>", "<|flush|>")),  # solar-open
            ("</s>", NORMAL, ("<|tool_response>",)))                 # gemma 4
_EOG_ID_KEYS = ("eos", "eot", "eom", "fim_pad", "fim_rep", "fim_sep")

# Per tokenizer model: default special ids and whether BOS/EOS/space prefix are added.
_MODEL_DEFAULTS = {
    "llama": dict(bos=1, eos=2, add_bos=True, add_space_prefix=True),
    "gpt2": dict(bos=11, eos=11, add_bos=False, add_space_prefix=False),
}


@dataclass(frozen=True)
class Vocab:
    model: str
    pre: str
    tokens: tuple[str, ...]
    types: tuple[int, ...]
    scores: tuple[float, ...]
    merges: tuple[str, ...]
    token_to_id: dict[str, int]
    bos_id: int | None
    eos_id: int | None
    eog_ids: frozenset[int]
    add_bos: bool
    add_eos: bool
    add_space_prefix: bool

    @classmethod
    def from_metadata(cls, meta: dict) -> "Vocab":
        model = meta.get("tokenizer.ggml.model")
        if model not in _MODEL_DEFAULTS:
            raise VkllmError(f"unsupported tokenizer model {model!r} (supported: gpt2, llama)")
        pre = _pre_tokenizer(model, meta.get("tokenizer.ggml.pre"))
        tokens = [t if t else f"[EMPTY_{i}]" for i, t in enumerate(_required(meta, "tokenizer.ggml.tokens"))]
        n = len(tokens)
        types = list(meta.get("tokenizer.ggml.token_type") or [NORMAL] * n)
        scores = tuple(float(s) for s in (meta.get("tokenizer.ggml.scores") or [0.0] * n))
        if len(types) < n or len(scores) < n:
            raise VkllmError("tokenizer metadata: token_type or scores shorter than the token list")
        token_to_id = {}
        for i, t in enumerate(tokens):
            if token_to_id.setdefault(t, i) != i:
                raise VkllmError(f"duplicate token in vocabulary: {t!r} has ids {token_to_id[t]} and {i}")
        merges = tuple(meta.get("tokenizer.ggml.merges") or ())
        if model == "gpt2" and not merges:
            raise VkllmError("tokenizer metadata: a gpt2 tokenizer needs tokenizer.ggml.merges")

        defaults = _MODEL_DEFAULTS[model]
        ids = {name: _special_id(meta, name, defaults.get(name), n) for name in ("bos", *_EOG_ID_KEYS)}
        add_bos = bool(meta.get("tokenizer.ggml.add_bos_token", defaults["add_bos"] or pre in ADD_BOS_BY_DEFAULT))
        add_eos = bool(meta.get("tokenizer.ggml.add_eos_token", False))
        add_space_prefix = bool(meta.get("tokenizer.ggml.add_space_prefix", defaults["add_space_prefix"]))
        for flag, name in ((add_bos, "bos"), (add_eos, "eos")):
            if flag and ids[name] is None:
                raise VkllmError(f"tokenizer metadata: add_{name}_token is true but {name}_token_id is not set")

        eog = _end_of_generation(types, token_to_id, [ids[k] for k in _EOG_ID_KEYS])
        return cls(model=model, pre=pre, tokens=tuple(tokens), types=tuple(types[:n]), scores=scores[:n],
                   merges=merges, token_to_id=token_to_id, bos_id=ids["bos"], eos_id=ids["eos"],
                   eog_ids=eog, add_bos=add_bos, add_eos=add_eos, add_space_prefix=add_space_prefix)


def _end_of_generation(types: list[int], token_to_id: dict[str, int], eog_ids: list[int | None]) -> frozenset[int]:
    """The EOG set; also turns every token llama.cpp recognises by its text into a control token
    (types is updated in place)."""
    for text in (*_EOT_TEXTS, *_FIM_TEXTS, *_FIM_EOG_TEXTS, *_EOG_TEXTS):
        if text in token_to_id:
            types[token_to_id[text]] = CONTROL
    eog = {token_to_id[t] for t in (*_FIM_EOG_TEXTS, *_EOG_TEXTS) if t in token_to_id}
    eog.update(i for i in eog_ids if i is not None)
    for text, kind, signs in _NOT_EOG:
        tid = token_to_id.get(text)
        if tid in eog and all(token_to_id.get(t) in eog for t in signs):
            eog.discard(tid)
            types[tid] = kind
    return frozenset(eog)


def _pre_tokenizer(model: str, pre: str | None) -> str:
    if model != "gpt2":
        return "default"
    pre = pre or "default"
    if pre not in PRE_TOKENIZERS:
        raise VkllmError(f"unsupported pre-tokenizer {pre!r} (supported: {', '.join(sorted(PRE_TOKENIZERS))})")
    return pre


def _required(meta: dict, key: str):
    if key not in meta:
        raise VkllmError(f"tokenizer metadata: {key} is missing")
    return meta[key]


def _special_id(meta: dict, name: str, default: int | None, n: int) -> int | None:
    """llama.cpp's rule: a key naming an id outside the vocabulary is ignored, and so is a
    default outside it."""
    value = meta.get(f"tokenizer.ggml.{name}_token_id")
    if value is not None and 0 <= int(value) < n:
        return int(value)
    return default if default is not None and default < n else None
