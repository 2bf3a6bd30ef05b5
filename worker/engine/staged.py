"""A recorded forward pass as one command buffer per stage (worker/engine/placement.py), submitted
in stage order. The stages' contexts on one device share its logical device and queue
(engine.open_contexts; each keeps its own pools, kernels and recordings), and what the stages hand
each other (the hidden state, the greedy token) lies in host memory that all of them import
(vk/linked.py's SharedMemory): no stage copies it through the host. The host-written inputs of the
first stage's workspace that later stages read too (step values, logits rows) are copied to theirs
before the first submission. With one stage a pass is one submission: the unsplit path.

The order of the stages: where the contexts share a timeline semaphore (one logical device, or one
GPU whose driver exports them: vk/linked.py's Timeline), every stage is queued at once, each
waiting on the GPU for the one before. Otherwise the host waits on the earlier stage's fence before
it submits the next, polling it first (HANDOFF_POLL_S): the GPU idles from the signal until the
next stage is queued, and a blocking wait wakes late. llama-3.1-8b Q4_K_M over two contexts of the
H200 (2026-12-02, tg128 tok/s, before the shared memory and the timeline): host waits blocking
243.6 against 298.3 on one context (0.82x, 736 us of host time a token), polled 258.4 against 301.3
(0.86x, 505 us). With the timeline, on an H100 (2026-12-06, runs alternating): 296.0 against 338.1
and 294.7 against 331.6 (0.875x, 0.889x), the host's share of a token as on one context (32-86 us):
the stages' own GPU time grew by ~0.4 ms a token. Where it goes (H100, the same day, per-dispatch
timestamps of one pass): the first stage's dispatches (1.53 ms) took their one-context times but
one, ~330 us longer (the whole pass 3.58 ms against 3.16): a different kernel from run to run,
later in the stage when the second stage was submitted 2 ms after the first (on an idle clock);
with the host ordering the stages no dispatch was. So the GPU interrupts a running stage,
mid-kernel, to look at the other context's queued stage, and comes back: a pass of two stages in
flight pays it once a stage, two GPUs (a scheduler each) never. Queuing each stage late instead
(2026-12-06, reverted: the host polled a word each stage set 1 to 8 layers before its end, then
queued the next) moves the loss, not removes it: with 1-3 layers of lead no dispatch was slower but
the GPU idled ~170 us between the stages (tg128 301.4, 301.0, 300.9 tok/s against 301.4 queued at
once, runs alternating), with 4 or more the switch mid-stage came back (266-249 tok/s). So each
switch between two VkDevices costs the one GPU ~200 us, wherever it falls, two a token: 0.88x of
the unsplit 342 tok/s. One logical device for the contexts of one GPU has no such switch (H100,
2026-12-07, tg128 -r 2 three times alternating: 332.0, 332.6, 332.6 tok/s against 339.2, 340.6,
340.7 unsplit, 0.976-0.979x), and a GPU's contexts now share one. Host ordering (two GPUs) loses
more in decode (H100, 2026-12-06, tg128, runs alternating: one context 340.4 and 340.5 tok/s, two
VkDevices on the timeline 299.0 and 298.9, host-ordered 286.4 and 291.4 with 457-516 us of host
time a token). A CPU device (lavapipe) runs the stage on the host's cores, from which a poll would
take one: there a hand-off blocks (tiny-llama split on lavapipe: 151.7 tok/s blocking, 128.5
polling)."""

HANDOFF_POLL_S = 0.01   # covers a decode stage; a prefill chunk's stage polls this long, then blocks


def handoff_poll_s(ctx) -> float:
    """How long a hand-off polls the fence of a stage that ran on `ctx`."""
    return 0.0 if ctx.info.kind == "cpu" else HANDOFF_POLL_S


class StagedPass:
    def __init__(self, recordings: list, workspaces: list, inputs: dict[str, int], timeline=None):
        """`recordings`: one finished Recording per stage; `inputs`: workspace buffer name ->
        bytes that the host writes into the first stage's and the later stages read too;
        `timeline`: the stages' shared Timeline, None where the host orders them."""
        self.recordings, self._workspaces = recordings, workspaces
        self._inputs, self._timeline = inputs, timeline

    def submit(self, fences: list):
        """Queues the pass (`fences`: one per stage; with a timeline only the last one's is
        used); returns once its last stage is queued."""
        first = self._workspaces[0]
        for ws in self._workspaces[1:]:
            for name, nbytes in self._inputs.items():
                getattr(ws, name).view()[:nbytes] = getattr(first, name).view()[:nbytes]
        last = len(self.recordings) - 1
        for s, rec in enumerate(self.recordings):
            if self._timeline is not None:
                self._timeline.submit(rec, fences[s] if s == last else None)
                continue
            if s:
                earlier = self.recordings[s - 1].ctx
                earlier.wait(fences[s - 1], handoff_poll_s(earlier))
            rec.ctx.submit(rec, fences[s])

    def wait(self, fences: list, poll_s: float = 0.0):
        """Waits for the last stage (the earlier ones were waited on by `submit`); `poll_s`: as
        Context.wait's."""
        self.recordings[-1].ctx.wait(fences[-1], poll_s)

    def run(self, fences: list):
        self.submit(fences)
        self.wait(fences)

    def timings_ns(self) -> list[tuple[str, float]]:
        """Every stage's (label, ns) in order (Recording.timings_ns)."""
        return [timing for rec in self.recordings for timing in rec.timings_ns()]

    def gpu_seconds(self) -> float:
        """GPU time of the stages' forward passes (each stage's first timing), host hand-offs excluded."""
        return sum(rec.timings_ns()[0][1] for rec in self.recordings) * 1e-9

    def destroy(self):
        for rec in self.recordings:
            rec.destroy()
