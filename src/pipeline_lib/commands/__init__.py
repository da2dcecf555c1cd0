"""One module per CLI stage: ``register(subparsers) -> parser`` and ``run(args) -> int``."""
