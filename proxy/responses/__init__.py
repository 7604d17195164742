"""The OpenAI Responses API: its items, streams, WebSocket and compaction items (spec 11)."""
