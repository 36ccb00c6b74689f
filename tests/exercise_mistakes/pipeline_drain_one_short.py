"""A typical mistake in exercises/pipeline_schedule.py: the drain starts one micro-batch late, so the last
backward is never run and its gradient never reaches the stage's parameters."""


def one_f_one_b(stage, num_stages, microbatches):
    warmup = min(microbatches, num_stages - 1 - stage)
    order = [("F", m) for m in range(warmup)]
    for m in range(warmup, microbatches):
        order += [("F", m), ("B", m - warmup)]
    return order + [("B", m) for m in range(microbatches - warmup + 1, microbatches)]  # the mistake: + 1
