"""The merge loop both BPE and SentencePiece use, in llama.cpp's order.

llama.cpp keeps the symbols of a word in a linked list and the candidate pairs in a priority
queue; it pops the best pair (ties: the leftmost), skips it when either side has changed since
it was queued, merges, and queues the two new neighbour pairs. Reproducing that order (rather
than, say, merging every occurrence of the best pair at once) is what makes the ids match
llama.cpp on vocabularies where merge priorities are not monotonic.
"""
import heapq
from collections.abc import Callable


def merge_symbols(symbols: list[str], priority: Callable[[str, str], float | None]) -> list[str]:
    """Merge adjacent symbols, best (lowest) priority first; None means "never merge"."""
    n = len(symbols)
    if n < 2:
        return symbols
    syms = list(symbols)
    nxt = list(range(1, n + 1))
    nxt[-1] = -1
    prv = list(range(-1, n - 1))
    queue: list[tuple[float, int, int, str]] = []

    def push(left: int, right: int) -> None:
        p = priority(syms[left], syms[right])
        if p is not None:
            heapq.heappush(queue, (p, left, right, syms[left] + syms[right]))

    for i in range(n - 1):
        push(i, i + 1)
    while queue:
        _, left, right, text = heapq.heappop(queue)
        if not syms[left] or not syms[right] or syms[left] + syms[right] != text:
            continue
        syms[left] = text
        syms[right] = ""
        after = nxt[right]
        nxt[left] = after
        if after >= 0:
            prv[after] = left
        if prv[left] >= 0:
            push(prv[left], left)
        if after >= 0:
            push(left, after)
    return [s for s in syms if s]
