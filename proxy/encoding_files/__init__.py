"""tiktoken's BPE files for o200k_base and cl100k_base, so the proxy counts exactly with no network.

The files are named as tiktoken names its cache entries (the SHA-1 of the download URL), so this
folder, when it is a folder on disk, is a tiktoken cache directory as it stands:

- `fb374d419588a4632f3f557e76b4b70aebbca790`: o200k_base.tiktoken
- `9b5ad71b2ce5302211f9c61530b329a4922fc6a4`: cl100k_base.tiktoken

Both are the files tiktoken downloads from openaipublic.blob.core.windows.net/encodings/ (tiktoken
checks their SHA-256 when it loads them); MIT licence, see LICENSE-tiktoken. proxy/encodings.py
loads them.
"""
