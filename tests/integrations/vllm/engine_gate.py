"""The gate of the tests that run a vLLM engine: its environment, and a module-level skip with the reason."""

from __future__ import annotations

import os
from types import ModuleType

import pytest

ENGINE_ENVIRONMENT = {
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",  # the engine in this process: starts in seconds, hooks inspectable
    "VLLM_CPU_KVCACHE_SPACE": "1",  # GiB
    "HF_HUB_OFFLINE": "1",
}


def require_vllm_engine() -> ModuleType:
    """vLLM, imported with the engine environment set; else the calling test module is skipped, saying why."""
    for name, value in ENGINE_ENVIRONMENT.items():
        os.environ.setdefault(name, value)
    vllm = pytest.importorskip(
        "vllm", reason="the vLLM extra is not installed (make vllm / pip install 'dualpath[vllm]')"
    )
    if os.environ.get("DUALPATH_VLLM_TESTS") != "1":
        pytest.skip(
            "vLLM engine tests run in `make test-vllm` (DUALPATH_VLLM_TESTS=1), in their own process: "
            "vLLM binds the threads and memory policy of the process it runs in",
            allow_module_level=True,
        )
    return vllm
