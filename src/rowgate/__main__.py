"""`python -m rowgate …`: the `rowgate` command, for an environment whose scripts
directory is not on PATH."""

from __future__ import annotations

from rowgate.cli.main import main

if __name__ == "__main__":
    main()
