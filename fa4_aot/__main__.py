"""`python -m fa4_aot` runs the CLI (the same as the `fa4-aot` console script)."""

from .cli import main

main()
