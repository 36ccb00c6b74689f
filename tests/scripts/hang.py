"""Every rank prints, then hangs forever; with --ignore-sigterm only SIGKILL can stop it."""
import signal
import sys
import time

if "--ignore-sigterm" in sys.argv:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
print("hanging now", flush=True)
while True:
    time.sleep(1)
