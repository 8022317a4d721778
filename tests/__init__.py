"""belugactl's tests. A package so that shared helpers import as `tests.support.<name>` (pytest puts the
repository root on sys.path through `pythonpath` in pyproject.toml)."""
