"""The protocols the proxy serves, one package each (chat, responses, messages), listed in
registry.py; the request path they share (pipeline.py, send.py) names none of them."""
