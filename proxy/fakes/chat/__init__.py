"""The chat fake's parts (proxy/fake_upstream.py serves them): OpenAI's validation of a request
(validate.py), the default answers (replies.py) and the stream of an answer (events.py)."""
