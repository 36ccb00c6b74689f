"""Rank 0 dies from a signal (as in a C++ crash): no Python traceback to show."""
import os
import time

if os.environ["RANK"] == "0":
    os.abort()
time.sleep(30)
