"""Protocol adapters: what each API's bodies, streams, errors and credentials look like, onto the
neutral model (proxy/model.py); the interface is base.py."""
