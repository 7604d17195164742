"""tiktoken encodings without a download: the copies shipped in proxy/encoding_files.

With TIKTOKEN_CACHE_DIR set, tiktoken's own lookup comes first (that cache, else a download); the
packaged copy is the fallback. Unset, the packaged copy is used directly. tiktoken finds its files
only through TIKTOKEN_CACHE_DIR, so the variable points at the packaged folder while tiktoken loads
(a folder extracted to a temporary directory when the package is inside a zip), and is restored
afterwards; tiktoken keeps the loaded encoding, so this happens once per process.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
from importlib import resources
from pathlib import Path
from typing import Any

# encoding name -> file name in proxy/encoding_files (tiktoken's cache key: sha1 of the URL)
PACKAGED = {
    "o200k_base": "fb374d419588a4632f3f557e76b4b70aebbca790",
    "cl100k_base": "9b5ad71b2ce5302211f9c61530b329a4922fc6a4",
}
_ENV = "TIKTOKEN_CACHE_DIR"
_lock = threading.Lock()


class EncodingUnavailable(Exception):
    pass


def get_encoding(name: str) -> Any:
    """tiktoken's `name` encoding; EncodingUnavailable when neither tiktoken nor the package has it."""
    import tiktoken

    first: Exception | None = None
    if _ENV in os.environ or name not in PACKAGED:
        try:
            return tiktoken.get_encoding(name)
        except Exception as e:  # no cache entry and no network, an unknown name
            first = e
    if name not in PACKAGED:
        raise EncodingUnavailable(f"{name}: {first}") from first
    try:
        return _from_package(name)
    except Exception as e:
        why = f"{first}; " if first else ""
        raise EncodingUnavailable(f"{name}: {why}packaged copy unusable ({e})") from e


def _from_package(name: str) -> Any:
    import tiktoken

    files = resources.files("proxy.encoding_files")
    with _lock:
        saved = os.environ.get(_ENV)
        tmp = None
        try:
            if isinstance(files, Path):
                folder = str(files)
            else:  # inside a zip: tiktoken needs a real file
                tmp = tempfile.mkdtemp(prefix="compaction-proxy-tiktoken-")
                entry = PACKAGED[name]
                Path(tmp, entry).write_bytes(files.joinpath(entry).read_bytes())
                folder = tmp
            if not Path(folder, PACKAGED[name]).is_file():
                raise FileNotFoundError(f"{PACKAGED[name]} missing from proxy/encoding_files")
            os.environ[_ENV] = folder
            return tiktoken.get_encoding(name)
        finally:
            if saved is None:
                os.environ.pop(_ENV, None)
            else:
                os.environ[_ENV] = saved
            if tmp:
                shutil.rmtree(tmp, ignore_errors=True)
