"""threadline: async LLM agent conversations that never overflow the context window."""
