"""find_the_hang 3 of 3: a collective whose tensors have different shapes on different ranks.

    torchrun --standalone --nproc-per-node=3 exercises/find_the_hang/shape_mismatch.py

Each rank has per-sample scores for its own shard, and the shards differ in size (4, 5, 6 samples with 3
ranks). Rank 0 wants every sample's score to report the worst ones. The all_gather below fails or hangs,
because every rank must pass tensors of one same shape. Fix it (hint: gather the lengths first, then pad).
"""
import json

import torch
import torch.distributed as dist


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    scores = torch.arange(4 + rank, dtype=torch.float32) * 0.5 + rank  # 4 + rank samples on this rank
    gathered = [torch.empty_like(scores) for _ in range(world)]  # the bug: assumes every rank has as many
    dist.all_gather(gathered, scores)
    every_score = torch.cat(gathered)
    if rank == 0:
        worst = sorted(every_score.tolist(), reverse=True)[:3]
        print(f"rank 0: {len(every_score)} scores, the worst {worst}")
        print("RESULT " + json.dumps({"samples": len(every_score), "worst": worst,
                                      "mean": round(every_score.mean().item(), 4)}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
