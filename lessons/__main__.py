"""`python -m lessons doctor ...`: the DDP doctor from a terminal (lessons/doctor.py holds its usage line)."""
import sys

COMMANDS = ("doctor",)

if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] not in COMMANDS:
        from lessons.doctor import USAGE

        print(f"usage: {USAGE}  (commands: {', '.join(COMMANDS)})", file=sys.stderr)
        sys.exit(2)
    from lessons.doctor import main

    sys.exit(main(sys.argv[2:]))
