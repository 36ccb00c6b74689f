"""Prints one line at once, then works for a while: its line must reach the caller before the launch ends."""
import os
import time

print(f"tick from rank {os.environ['RANK']}", flush=True)
time.sleep(4)
print("done", flush=True)
