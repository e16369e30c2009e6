"""samattn's benchmark harness: ``python -m samattn.bench --help``."""
