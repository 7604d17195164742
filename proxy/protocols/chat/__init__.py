"""OpenAI Chat Completions: its route, adapter, body checks and recall dialect."""
