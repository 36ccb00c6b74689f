"""A typical mistake in exercises/pipeline_schedule.py: the warm-up counted as the stage's mirror from the end with
a bit trick, (num_stages - 1) ^ stage. With 2, 4, 8 ... stages num_stages - 1 is all ones and the XOR is
num_stages - 1 - stage; with 3 or 5 stages it is not (with 3, stage 1 warms up with 3 forwards, not 1)."""


def one_f_one_b(stage, num_stages, microbatches):
    warmup = min(microbatches, (num_stages - 1) ^ stage)  # the mistake: ^ is not -, unless num_stages is 2 ** k
    order = [("F", m) for m in range(warmup)]
    for m in range(warmup, microbatches):
        order += [("F", m), ("B", m - warmup)]
    return order + [("B", m) for m in range(microbatches - warmup, microbatches)]
