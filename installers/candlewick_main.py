"""Entry point of the PyInstaller bundle: the same `candlewick` command as the pip install."""

import multiprocessing
import sys

from app.cli import main

if __name__ == "__main__":
    multiprocessing.freeze_support()  # a frozen app re-executes itself for child processes
    sys.exit(main())
