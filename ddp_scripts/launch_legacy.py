"""An entry for `python -m torch.distributed.launch` (deprecated: use torchrun), fixed for torch >= 2.0.

    python -m torch.distributed.launch --nproc-per-node=2 ddp_scripts/launch_legacy.py
"""
import argparse
import os

parser = argparse.ArgumentParser()
# torch >= 2.0 passes --local-rank=N, older torch --local_rank=N: accept both spellings.
# (Better still: read os.environ["LOCAL_RANK"], which torchrun and the launcher both set.)
parser.add_argument("--local-rank", "--local_rank", type=int)
args = parser.parse_args()
from tiny_train import train  # after parsing: a bad flag fails fast
train(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), "torch.distributed.launch", args.local_rank)
