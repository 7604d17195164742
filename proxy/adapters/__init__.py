"""Wire protocols as adapters onto the neutral model (proxy/model.py); see base.py."""
