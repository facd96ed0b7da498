"""vla-fleet: the fleet rollout's three programs under one command.

    vla-fleet server init|serve ...   the hawkBit-DDI server (vla_fleet.server)
    vla-fleet agent ...               a device's DDI client (vla_fleet.agent)
    vla-fleet install BUNDLE ...      RAUC's install as vlad's handlers see it (vla_fleet.install)

Each keeps its own options (`vla-fleet agent --help`); `python -m vla_fleet.<program>` runs
the same code."""

import importlib
import sys

PROGRAMS = ("server", "agent", "install")


def main(argv=None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] not in PROGRAMS:
        found = repr(args[0]) if args else "none"
        print(f"vla-fleet: expected a program ({', '.join(PROGRAMS)}), found {found}", file=sys.stderr)
        return 2
    program = importlib.import_module(f"vla_fleet.{args[0]}")
    sys.argv = [f"vla-fleet {args[0]}", *args[1:]]
    return program.main() or 0


if __name__ == "__main__":
    sys.exit(main())
