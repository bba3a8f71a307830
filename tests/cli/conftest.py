"""The trained tiny run that the catalogue's test files start from is `trained_run` in tests/conftest.py."""
