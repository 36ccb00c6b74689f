"""A typical mistake in exercises/pipeline_schedule.py: in the steady state the backward comes before the new
forward, so the last stage (no warm-up) runs the backward of micro-batch 0 before its forward."""


def one_f_one_b(stage, num_stages, microbatches):
    warmup = min(microbatches, num_stages - 1 - stage)
    order = [("F", m) for m in range(warmup)]
    for m in range(warmup, microbatches):
        order += [("B", m - warmup), ("F", m)]  # the mistake: B first
    return order + [("B", m) for m in range(microbatches - warmup, microbatches)]
