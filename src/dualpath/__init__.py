"""DualPath: agentic LLM serving on PD-disaggregated clusters with two KV read paths."""
