"""The strict fake Anthropic Messages upstream (see server.py)."""

from proxy.fakes.messages.server import FakeMessages

__all__ = ["FakeMessages"]
