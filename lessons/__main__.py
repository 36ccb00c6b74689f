"""`python -m lessons doctor ...` and `python -m lessons check ...`: the take-home tools from a terminal (installed,
also `ddp-doctor` and `ddp-check`). Each tool's module holds its usage line."""
import sys

COMMANDS = ("doctor", "check")

if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] not in COMMANDS:
        from lessons.tools.check import USAGE as CHECK_USAGE
        from lessons.tools.doctor import USAGE as DOCTOR_USAGE

        print(f"usage: {DOCTOR_USAGE}\n       {CHECK_USAGE}", file=sys.stderr)
        sys.exit(2)
    if sys.argv[1] == "doctor":
        from lessons.tools.doctor import main
    else:
        from lessons.tools.check import main
    sys.exit(main(sys.argv[2:]))
