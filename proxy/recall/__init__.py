"""Recall (design.md § Recall): nothing the proxy compacts is gone; the model looks originals up through a
tool the proxy declares and answers itself."""
