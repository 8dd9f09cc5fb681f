"""Build fingerprint: what must match for a cached plan to be reused."""
from __future__ import annotations

import hashlib
import json
import sys
from typing import Any

import torch


def fingerprint(device: str = "cpu") -> dict[str, Any]:
    import shapeplan
    from shapeplan.plan.serialize import FORMAT_VERSION
    return {"shapeplan": shapeplan.__version__, "torch": torch.__version__.split("+")[0],
            "python": f"{sys.version_info.major}.{sys.version_info.minor}", "device": str(device),
            "plan_format": FORMAT_VERSION}


def cache_key(model_hash: str, options: dict[str, Any], fp: dict[str, Any]) -> str:
    blob = json.dumps({"model": model_hash, "options": options, "fingerprint": fp}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:40]
