"""An entry for `python -m torch.distributed.launch`, as written for torch < 2.0. It fails today.

    python -m torch.distributed.launch --nproc-per-node=2 ddp_scripts/launch_legacy_broken.py
"""
import argparse
import os

parser = argparse.ArgumentParser()
parser.add_argument("--local_rank", type=int)  # torch >= 2.0 passes --local-rank=N: "unrecognized arguments"
args = parser.parse_args()
from tiny_train import train  # after parsing: a bad flag fails fast
train(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), "torch.distributed.launch", args.local_rank)
