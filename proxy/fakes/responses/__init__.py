"""The strict fake OpenAI Responses upstream (see server.py)."""

from proxy.fakes.responses.server import FakeResponses

__all__ = ["FakeResponses"]
