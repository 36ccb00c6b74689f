"""A typical mistake in exercises/pipeline_schedule.py: the warm-up is num_stages - 1 - stage forwards, not capped by
the micro-batches there are: right whenever microbatches >= num_stages - 1, but with fewer micro-batches than that the
first stage warms up with forwards of micro-batches that do not exist (and drains backwards numbered below 0)."""


def one_f_one_b(stage, num_stages, microbatches):
    warmup = num_stages - 1 - stage  # the mistake: no min(microbatches, ...)
    order = [("F", m) for m in range(warmup)]
    for m in range(warmup, microbatches):
        order += [("F", m), ("B", m - warmup)]
    return order + [("B", m) for m in range(microbatches - warmup, microbatches)]
