"""The `ferry` console command of the wheel: execs the C CLI (cli/) shipped as ferry/_bin/ferry.

exec, not a subprocess: the CLI gets the terminal, the signals and the exit status as if it were
run directly, and no Python process stays behind it.
"""
import os
import sys


def main():
    exe = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_bin", "ferry")
    if not os.access(exe, os.X_OK):
        sys.stderr.write(f"ferry: {exe}: the CLI binary is missing or not executable in this install "
                         "of ferry-io (the wheel ships it; reinstall the package)\n")
        return 127
    os.execv(exe, ["ferry"] + sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
