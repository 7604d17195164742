"""Protocol adapters: what each API's bodies, streams, errors and credentials look like."""
