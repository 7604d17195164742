"""The Anthropic Messages API (spec section 12): routing, body, cuts, breakpoints, streams, errors."""
