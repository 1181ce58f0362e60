"""``python -m mcdla`` runs the command line."""

from mcdla.cli import main

main()
