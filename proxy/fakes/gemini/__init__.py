"""The strict fake Google Gemini API upstream (see server.py)."""

from proxy.fakes.gemini.server import FakeGemini

__all__ = ["FakeGemini"]
