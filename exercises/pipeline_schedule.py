"""Exercise (lesson 15b): the 1F1B order of one pipeline stage.

Define one_f_one_b(stage, num_stages, microbatches) -> list: the forwards ("F", m) and backwards ("B", m) that stage
`stage` (0 is the first) of a pipeline of `num_stages` runs, in order, for micro-batches 0 .. microbatches - 1.
A forward of m waits for the previous stage's forward of m; a backward of m waits for the next stage's backward of
m. 1F1B: fill the pipeline with a few forwards, then alternate one forward and one backward, then drain the
backwards, so that stage s never holds more than min(microbatches, num_stages - s) micro-batches' activations.

The check reads every stage's order at 2, 3, 4, 5 and 8 stages, and with fewer micro-batches than stages, and names
the mistake (a deadlock, a backward before its forward, a micro-batch lost or run twice, a warm-up longer than the
micro-batches, GPipe's memory, an order that takes longer than 1F1B's 2(M + N - 1) steps: the stages must overlap);
then it runs your orders on real ranks with send/recv, at 2, 3 and 4 stages, and compares every stage's gradients
with one process.

Check it:   python -m lessons check pipeline_schedule
"""


def one_f_one_b(stage: int, num_stages: int, microbatches: int) -> list[tuple[str, int]]:
    # TODO: how many forwards must stage `stage` run before its first backward can come back from the last stage?
    raise NotImplementedError("return the list of ('F', m) and ('B', m) this stage runs, in order")
