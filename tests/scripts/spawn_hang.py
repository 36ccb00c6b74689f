"""mp.spawn two children that print, then hang forever: only the launcher's clean-up can end them."""
import time

import torch.multiprocessing as mp


def hang(rank):
    print(f"rank {rank} hanging now", flush=True)
    while True:
        time.sleep(1)


if __name__ == "__main__":
    mp.spawn(hang, nprocs=2)
