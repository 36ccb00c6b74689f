"""Prints one line at once, then works until the caller has seen every rank's line (it creates the file named by
the first argument): each line must reach the caller while the launch still runs."""
import os
import sys
import time

print(f"tick from rank {os.environ['RANK']}", flush=True)
deadline = time.monotonic() + 60  # a caller that never looks: the launch still ends
while not os.path.exists(sys.argv[1]) and time.monotonic() < deadline:
    time.sleep(0.05)
print("done", flush=True)
