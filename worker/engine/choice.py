"""How a token is chosen from what a pass leaves in the workspace, shared by Engine.generate and
Batch: what the GPU hands the sampler (the argmax, the top-k candidates, or all logits), the
pick from one logits row, and the token's log-probabilities."""
import numpy as np

from worker.engine.generation import TokenLogprobs
from worker.engine.kernels.shapes import MAX_K
from worker.engine.sampling import SamplingParams

MASKED = "_masked"   # a selection's suffix: the token mask applies before it (Runner)
HOST = "_host"       # and after that one: a batched pass's logits rows are copied to host memory


def selection(params: SamplingParams) -> str:
    """What the GPU hands the sampler: the argmax when it alone decides, the top-k candidates
    when every filter works inside them (no penalties, top_k within the kernel's limit), else
    all logits (also under min_tokens: the top-k may hold end-of-generation tokens only)."""
    if not params.needs_full_logits:
        return "argmax"
    if not params.has_penalties and not params.min_tokens and 0 < params.top_k <= MAX_K:
        return "topk"
    return "logits"


def next_token(runner, sampler, select: str, history: list[int], row: int = 0) -> int:
    """The token of logits row `row` after a pass that selected `select` (for every row): the
    argmax when the sampler is greedy (the top-k's first under "topk", the same token: both
    take the lowest index among equal values), else the sampler's draw from the candidates
    or from the row (in host memory: always after a one-sequence pass, after a batched one when
    its selection ends in HOST)."""
    select = select.removesuffix(HOST).removesuffix(MASKED)
    wanted = selection(sampler.params)
    if wanted == "argmax":
        return runner.read_argmax(row) if select == "argmax" else int(runner.read_topk(row)[0][0])
    if select == "topk" and wanted == "topk":
        return sampler.sample_candidates(*runner.read_topk(row), history)
    return sampler.sample(runner.read_logits(row), history)


def token_logprobs(logits: np.ndarray, token: int, top_ids: np.ndarray, top_values: np.ndarray,
                   top: int) -> TokenLogprobs:
    """`token`'s log-softmax and the `top` (at most MAX_K) most likely tokens' from the GPU's
    top-k candidates. The normaliser, a log-sum-exp over the whole vocabulary, is summed here
    from the logits row: the forward pass writes that row to host memory at every step whatever
    the selection, so reading it costs no transfer, and one pass of exp over it (float32, summed
    in float64) takes well under a millisecond even for a 150k vocabulary, next to a forward
    pass of many; a GPU reduction would save that at the price of another kernel and recording."""
    peak = float(top_values.max())
    normaliser = peak + float(np.log(np.exp(logits - np.float32(peak)).sum(dtype=np.float64)))
    # tokens a grammar masked (-inf) are no alternatives
    order = [i for i in np.argsort(-top_values, kind="stable")[:top] if np.isfinite(top_values[i])]
    return TokenLogprobs(float(logits[token]) - normaliser,
                         tuple((int(top_ids[i]), float(top_values[i]) - normaliser) for i in order))
