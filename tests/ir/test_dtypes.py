"""dtype_name: a torch dtype's name as torch spells it (what frozen records and messages store)."""
from __future__ import annotations

import pytest
import torch

from shapeplan.ir.dtypes import dtype, dtype_name


@pytest.mark.parametrize("td", [torch.float32, torch.bfloat16, torch.float16, torch.int64, torch.bool,
                                torch.float8_e4m3fn])
def test_dtype_name_round_trips_through_torch(td):
    name = dtype_name(td)
    assert "." not in name and getattr(torch, name) is td


def test_dtype_name_of_common_types_is_the_shapeplan_name_and_other_values_pass_through():
    for td in (torch.float32, torch.bfloat16, torch.int8):
        assert dtype(dtype_name(td)).torch is td
    assert dtype_name(None) == "None" and dtype_name("float16") == "float16"
