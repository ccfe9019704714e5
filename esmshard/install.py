"""Where esmshard's workflow files are: inside the installed package, under `workflow_files/`
(setup.py copies them at build time), or in a clone, the repository's own."""

from pathlib import Path

SHIPPED = Path(__file__).resolve().parent / "workflow_files"
CLONE = Path(__file__).resolve().parents[1]
