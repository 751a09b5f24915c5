import sys

try:
    from bnfix.cli import run
except KeyboardInterrupt:  # Ctrl-C while the command line itself loads: nothing was done yet
    sys.stderr.write("bnfix: interrupted before it started: nothing was changed\n")
    raise SystemExit(130) from None

raise SystemExit(run())
