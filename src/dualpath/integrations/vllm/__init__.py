"""DualPath inside vLLM: `DualPathConnector`, a KV connector (v1 API) over the DualPath store with both read
paths (docs/vllm.md). Importing this package needs vLLM (`pip install 'dualpath[vllm]'`); its helper modules
(config, plan, layer_wait, de_service) do not."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dualpath.integrations.vllm.connector import DualPathConnector

__all__ = ["DualPathConnector"]


def __getattr__(name: str) -> Any:
    # vLLM loads the class by name from `kv_connector_module_path`; importing it lazily keeps the vLLM-free
    # modules of this package importable without vLLM.
    if name == "DualPathConnector":
        from dualpath.integrations.vllm.connector import DualPathConnector

        return DualPathConnector
    raise AttributeError(name)
