"""The dashboard's assets (package data): the page, its script and style, and vendored uPlot."""
