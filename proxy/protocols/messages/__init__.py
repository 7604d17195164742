"""The Anthropic Messages API (design.md § Messages API): routing, body, cuts, breakpoints, streams, errors."""
