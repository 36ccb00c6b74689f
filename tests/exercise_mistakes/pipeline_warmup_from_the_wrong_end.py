"""A typical mistake in exercises/pipeline_schedule.py: the warm-up counted from the wrong end (stage, not
num_stages - 1 - stage): the first stage waits for a gradient before it has sent the forwards the last one needs."""


def one_f_one_b(stage, num_stages, microbatches):
    warmup = min(microbatches, stage)  # the mistake
    order = [("F", m) for m in range(warmup)]
    for m in range(warmup, microbatches):
        order += [("F", m), ("B", m - warmup)]
    return order + [("B", m) for m in range(microbatches - warmup, microbatches)]
