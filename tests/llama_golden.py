"""A real model on the GPU engine against its llama-cpp-python goldens (tests/golden/refmodel/
<name>.npz, written by tests/tools/make_refmodel_goldens.py): what test_engine_smollm2.py and
test_engine_gemma3.py check alike."""
from pathlib import Path

import numpy as np

from worker.engine.sampling import SamplingParams

GREEDY = SamplingParams(temperature=0.0, max_tokens=16)


class Golden:
    """One model's goldens: per prompt i its tokens (p{i}_tokens), llama.cpp's greedy tokens as
    shipped (p{i}_greedy) and in float (p{i}_exact_greedy), with each step's top-2 logits."""

    def __init__(self, name: str, eos: int):
        self.data, self.eos = np.load(Path(__file__).parent / "golden" / "refmodel" / f"{name}.npz"), eos
        self.prompts = range(len(self.data["prompts"]))

    def __getitem__(self, key: str):
        return self.data[key]

    def __contains__(self, key: str) -> bool:
        return key in self.data

    def greedy(self, key: str) -> list[int]:
        """A golden run's tokens up to its end-of-generation token."""
        tokens = self.data[key].tolist()
        return tokens[:tokens.index(self.eos)] if self.eos in tokens else tokens

    def continuations(self, engine) -> dict[int, list[int]]:
        """Our greedy tokens for every prompt."""
        return {i: [e.token_id for e in engine.generate_ids(self.data[f"p{i}_tokens"].tolist(), GREEDY)
                    if e.token_id is not None] for i in self.prompts}

    def check_tokenization(self, engine, i: int):
        assert engine.tokenizer.encode(str(self.data["prompts"][i])) == self.data[f"p{i}_tokens"].tolist()

    def check_as_shipped(self, ours: list[int], i: int):
        """Identical, or diverging exactly where llama.cpp's own float run leaves its quantized run
        (its CPU matmuls round activations to 8 bits), or where its top two nearly tie."""
        shipped = self.greedy(f"p{i}_greedy")
        step = first_difference(ours, shipped)
        if step is not None:
            top2, exact = self.data[f"p{i}_top2"][step], self.data[f"p{i}_exact_greedy"].tolist()
            assert top2[0] - top2[1] < 0.05 or exact[step] != shipped[step], \
                f"prompt {i}: ours {ours} llama.cpp {shipped}, diverging at step {step}"


def first_difference(ours: list[int], theirs: list[int]) -> int | None:
    """The first step where two runs differ (one ending earlier counts), None if they agree."""
    return next((s for s, (a, b) in enumerate(zip(ours + [-1], theirs + [-1])) if a != b), None)
