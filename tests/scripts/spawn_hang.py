"""Two children, started as mp.spawn starts them (multiprocessing's spawn), that print, then hang forever. Unlike
mp.spawn's they do not follow their parent when it dies: only the launcher's clean-up can end them. No torch here:
the children are up in a fraction of a second, long before the test's timeout."""
import multiprocessing
import time


def hang(rank):
    print(f"rank {rank} hanging now", flush=True)
    while True:
        time.sleep(1)


if __name__ == "__main__":
    children = [multiprocessing.get_context("spawn").Process(target=hang, args=(rank,)) for rank in range(2)]
    for child in children:
        child.start()
    for child in children:
        child.join()
