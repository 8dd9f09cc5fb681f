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


@pytest.fixture
def one_thread():
    """Tiny matrices: intra-op threads only add contention on a shared 2-core machine."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
