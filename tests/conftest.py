"""Fixtures shared by the whole test suite."""
import pytest

from shapeplan import diagnostics


@pytest.fixture
def diag():
    diagnostics.reset()
    diagnostics.enable("ALL", level="full")
    yield diagnostics
    diagnostics.disable()
    diagnostics.reset()
