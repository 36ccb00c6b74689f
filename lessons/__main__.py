"""python -m lessons doctor SCRIPT -n N [--timeout S] [--compare] [--nodes K] [-- ARGS]: the DDP doctor from a
terminal (lessons/doctor.py)."""
import sys

COMMANDS = ("doctor",)

if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] not in COMMANDS:
        print("usage: python -m lessons doctor SCRIPT -n N [--timeout S] [--compare] [--nodes K] [-- ARGS]"
              f"  (commands: {', '.join(COMMANDS)})", file=sys.stderr)
        sys.exit(2)
    from lessons.doctor import main

    sys.exit(main(sys.argv[2:]))
