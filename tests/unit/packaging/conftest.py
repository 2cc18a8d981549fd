"""The packaging tests' fixture: a packaged tiny model of each family (tests/helpers/packaged.py)."""

from tests.helpers.packaged import exp  # noqa: F401  (module fixture)
