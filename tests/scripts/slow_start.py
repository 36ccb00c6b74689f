"""Takes 3 s to get ready (as three imports of torch can), then works 1 s and ends."""
import time

time.sleep(3)
print("ready", flush=True)
time.sleep(1)
print("done", flush=True)
