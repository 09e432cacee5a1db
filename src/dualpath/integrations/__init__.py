"""DualPath inside other serving engines. `dualpath.integrations.vllm`: a vLLM KV connector (docs/vllm.md)."""
