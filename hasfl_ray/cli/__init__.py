"""Command-line interface of hasfl-ray (installed as the `hasfl-ray` console script)."""
