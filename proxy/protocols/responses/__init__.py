"""The OpenAI Responses API: its items, streams, WebSocket and compaction items (design.md § Responses API)."""
