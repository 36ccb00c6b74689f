"""Three multi-node mistakes of popular posts, each run as the post does and fixed, in one launch (lesson 10b).
Run each node in its own working directory (its disk); --shared-dir: a directory every node sees."""
import argparse
import json
import os
from pathlib import Path

import torch
import torch.distributed as dist

RANK, LOCAL_RANK = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])


def write_then_load(writes: bool, path: Path) -> str | None:
    """Where `writes`, save the file (a dataset, a checkpoint); after the barrier, every rank loads it."""
    if writes:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path.parent / "writers.txt", "a") as writers:  # who wrote to this path
            writers.write(f"{RANK}\n")
        torch.save(torch.arange(4.0), path)
    dist.barrier()  # everyone waits for the writers
    if not path.exists():
        return "no file to load"  # nobody on this node wrote it
    torch.load(path, weights_only=True)
    writers = (path.parent / "writers.txt").read_text().split()
    return f"one of {len(writers)} writers of the file" if writes and len(writers) > 1 else None


def metric_logged(logs: bool) -> str | None:
    correct = torch.tensor([RANK + 1.0])  # this rank's count of correct answers, say
    dist.reduce(correct, dst=0)  # dst is a GLOBAL rank: the sum lands on rank 0 only
    total = sum(range(1, dist.get_world_size() + 1))
    return f"logged {correct.item():g}, not the sum {total}" if logs and correct.item() != total else None


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--shared-dir", type=Path, required=True)
    parser.add_argument("--mistake", choices=["dataset", "checkpoint", "metric", "all"], default="all")
    args = parser.parse_args()
    dist.init_process_group("gloo")
    cases = {  # case: where the file goes (None: the metric), who writes (or logs) in the post, in the fix
        "dataset on each node's own disk": (Path("data"), "RANK", "LOCAL_RANK"),  # relative: on this node only
        "checkpoint on a shared file system": (args.shared_dir / "checkpoint", "LOCAL_RANK", "RANK"),
        "checkpoint, no shared file system": (Path("checkpoint"), "RANK", "LOCAL_RANK"),
        "metric summed with reduce(dst=0)": (None, "LOCAL_RANK", "RANK"),
    }
    is_zero = {"RANK": RANK == 0, "LOCAL_RANK": LOCAL_RANK == 0}
    runs = [(case, version, who) for case, (_, post, fix) in cases.items()
            if args.mistake == "all" or case.startswith(args.mistake) for version, who in (("post", post), ("fix", fix))]
    mine = [metric_logged(is_zero[who]) if cases[case][0] is None
            else write_then_load(is_zero[who], cases[case][0] / version / "file.pt") for case, version, who in runs]
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mine)  # every rank's problems, by global rank
    if RANK == 0:
        table = [{"case": case, "version": version, "where": f"{who} == 0",
                  "problems": {rank: theirs[n] for rank, theirs in enumerate(everyone) if theirs[n]}}
                 for n, (case, version, who) in enumerate(runs)]
        for row in table:
            print(f"{row['case'] if row['version'] == 'post' else '':35} {row['version'] + ':':5} where "
                  f"{row['where']:16} {row['problems'] or 'none'}")
        print("RESULT " + json.dumps({"world_size": len(everyone), "table": table}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
