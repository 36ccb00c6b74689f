"""A typical mistake in exercises/pipeline_schedule.py: one forward then its backward, micro-batch after micro-batch,
on every stage (no warm-up): right gradients, no deadlock, one activation held, but no two stages ever work at once."""


def one_f_one_b(stage, num_stages, microbatches):
    return [op for m in range(microbatches) for op in (("F", m), ("B", m))]
