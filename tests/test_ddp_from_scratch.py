"""DDP from scratch at the sizes notebook 03 does not launch (it runs 2 and 3 ranks, and torch's DDP features).

Each launch checks the three variants in turn: one start of torch per world size, not three."""
import pytest

import lessons
from conftest import SCRIPTS

VARIANTS = ["naive", "overlap", "bucketed"]


# 4 ranks with every parameter in one bucket (offsets into the flat buffer, the division by 4);
# 1 rank with a bucket per parameter, 6 (the notebook's default puts several in a bucket).
@pytest.mark.parametrize("nproc, bucket_mb, buckets", [(4, 100, 1), (1, 0.000001, 6)])
def test_every_variant_matches_single_process_and_torch_ddp(nproc, bucket_mb, buckets, launch_env):
    run = lessons.torchrun(SCRIPTS / "ddp_from_scratch.py", nproc=nproc, env=launch_env, show=False,
                           args=["--variant", *VARIANTS, "--bucket-mb", bucket_mb, "--steps", 3])
    results = run.result["variants"]
    assert [r["variant"] for r in results] == VARIANTS
    for r in results:
        assert r["world_size"] == nproc
        assert r["matches_single_process"] is True, r
        assert r["matches_torch_ddp"] is True, r
        assert r["max_abs_diff"] < 1e-5
    assert results[-1]["buckets"] == buckets
