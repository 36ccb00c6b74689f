"""A learner file that defines nothing yet: the check says which function it needs."""
