"""`python -m gateway` runs the same CLI as the `context-gateway` console script."""

from gateway.cli import main

main()
