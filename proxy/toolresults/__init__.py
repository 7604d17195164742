"""Oversized tool results: selection (pure), circuit breaker, and the summarizing stage."""
