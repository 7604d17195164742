"""The operator's view (design.md § The operator's view): metrics, logs, the journal, the bill, inspect, dashboard.

The core reports what happens through the named events of `hooks.Hooks`; the listeners here turn
them into Prometheus metrics, log lines, journal records and the bill.
"""
