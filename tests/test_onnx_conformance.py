"""ONNX node conformance: >= 90 % of ONNX's own cases pass in slot_by_slot on CPU, and no case
outside tests/onnx_conformance_known_failures.txt fails (a regression fails CI)."""
from __future__ import annotations

import pytest

from tests import onnx_conformance as conf


@pytest.fixture(scope="module")
def results() -> dict[str, str | None]:
    return conf.run_all(conf.collect())


def test_pass_rate_at_least_90_percent(results: dict[str, str | None]) -> None:
    n = len(results)
    passed = sum(r is None for r in results.values())
    assert n > 1500, f"only {n} cases collected"
    assert passed / n >= 0.90, f"pass rate {passed}/{n} = {passed / n:.1%} < 90 %"


def test_no_regressions(results: dict[str, str | None]) -> None:
    known = conf.read_known_failures()
    regressed = {k: v for k, v in results.items() if v is not None and k not in known}
    assert not regressed, "cases that used to pass now fail:\n" + "\n".join(
        f"  {k}: {v}" for k, v in sorted(regressed.items()))
