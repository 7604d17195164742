"""The prompt files, shipped inside the package as `proxy.prompt_files`.

A regular package (not a namespace one) so that `importlib.resources` reads the files the same way
from a wheel, a zip or an editable install.
"""
