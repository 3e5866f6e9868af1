"""The tests from the user's side (a package, so that its conftest does not shadow tests/py's)."""
