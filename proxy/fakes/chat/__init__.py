"""The strict fake OpenAI Chat Completions upstream (server.py) and its parts: OpenAI's validation
of a request (validate.py), the default answers (replies.py), the stream and body of an answer
(events.py), the prompt count (counting.py) and the models, embeddings and echo endpoints
(endpoints.py)."""

from proxy.fakes.chat.server import FakeUpstream

__all__ = ["FakeUpstream"]
