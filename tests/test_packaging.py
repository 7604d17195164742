"""The package is the product: a built wheel carries its prompts and tiktoken's encodings and reads
them through importlib.resources, also when imported straight from the zip (zipimport), with no
TIKTOKEN_CACHE_DIR and no network. CI (`.ci/run`) also installs the wheel and serves from it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from proxy.encodings import PACKAGED

REPO = Path(__file__).resolve().parent.parent
DEAD_PROXY = "http://127.0.0.1:9"  # any download attempt fails at once

# Known tokenizations (tiktoken's own counts); bytes/4 would give 11 and 10.
SAMPLES = [("Привет, как дела? 你好世界", {"o200k_base": 9, "cl100k_base": 14}),
           ("compaction-proxy counts tokens exactly", {"o200k_base": 7, "cl100k_base": 6})]

PROBE = r"""
import json, logging, sys
sys.path.insert(0, sys.argv[1])
logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")
import proxy, proxy.prompts as prompts, proxy.tokens as tokens
p = prompts.Prompts()
counter = tokens.TokenCounter()
loaded = counter.load()
samples = json.loads(sys.argv[2])
print(json.dumps({
    "proxy_file": proxy.__file__,
    "prompt_dir": str(prompts.default_dir()),
    "prompt_dir_type": type(prompts.default_dir()).__name__,
    "system_prompt": p.text("summarization-system")[:80],
    "loaded": loaded,
    "estimating": counter.estimating,
    "counts": [{enc: counter.count_text(text, enc) for enc in want} for text, want in samples],
}))
"""


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    # --no-build-isolation: the test extra brings setuptools, so no index is needed.
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                    "-w", str(out), str(REPO)], check=True, capture_output=True, timeout=300)
    (whl,) = out.glob("compaction_proxy-*.whl")
    return whl


def _offline_env(tmp: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("TIKTOKEN_CACHE_DIR", "DATA_GYM_CACHE_DIR")}
    # An empty temporary directory: tiktoken's default cache (<tmp>/data-gym-cache) holds nothing.
    env.update(TMPDIR=str(tmp), HTTPS_PROXY=DEAD_PROXY, HTTP_PROXY=DEAD_PROXY, https_proxy=DEAD_PROXY,
               http_proxy=DEAD_PROXY, NO_PROXY="", no_proxy="")
    return env


def _probe(archive: Path, tmp: Path) -> tuple[dict, str]:
    proc = subprocess.run([sys.executable, "-c", PROBE, str(archive), json.dumps(SAMPLES)], env=_offline_env(tmp),
                          cwd=tmp, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout), proc.stderr


def test_wheel_carries_prompts_encodings_and_the_fake_upstream(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    prompts = sorted(p.name for p in (REPO / "prompts").glob("*.md"))
    assert {f"proxy/prompt_files/{n}" for n in prompts} <= names
    assert {f"proxy/encoding_files/{f}" for f in PACKAGED.values()} <= names
    assert "proxy/encoding_files/LICENSE-tiktoken" in names
    assert {"proxy/fakes/server.py", "proxy/fakes/chat/server.py", "proxy/fakes/responses/server.py", "proxy/fakes/messages/server.py"} <= names


def test_prompts_and_exact_counts_from_the_zipped_wheel_offline(wheel: Path, tmp_path: Path) -> None:
    out, err = _probe(wheel, tmp_path)
    assert out["proxy_file"].startswith(str(wheel)), out  # imported from the zip, not the checkout
    assert out["prompt_dir_type"] != "PosixPath" and str(wheel) in out["prompt_dir"], out
    assert out["system_prompt"] == (REPO / "prompts" / "summarization-system.md").read_text().strip()[:80]
    assert out["loaded"] and not out["estimating"], err
    assert out["counts"] == [want for _, want in SAMPLES]
    assert "WARNING" not in err, err
    assert not (tmp_path / "data-gym-cache").exists()  # tiktoken downloaded nothing


def test_a_broken_install_estimates_with_one_warning(wheel: Path, tmp_path: Path) -> None:
    broken = tmp_path / "broken.zip"
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(broken, "w") as dst:
        for item in src.infolist():
            if not item.filename.startswith("proxy/encoding_files/") or item.filename.endswith(".py"):
                dst.writestr(item, src.read(item))
    out, err = _probe(broken, tmp_path)
    assert out["proxy_file"].startswith(str(broken))
    assert not out["loaded"] and out["estimating"]
    assert out["counts"][1] == {"o200k_base": 10, "cl100k_base": 10}  # bytes/4
    warnings = [line for line in err.splitlines() if line.startswith("WARNING")]
    assert len(warnings) == 1 and "estimated as bytes/4" in warnings[0], err


def test_wheel_carries_the_dashboard_and_its_vendored_library(wheel: Path, tmp_path: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    assets = ("index.html", "dashboard.js", "dashboard.css", "vendor/uPlot.iife.min.js", "vendor/uPlot.min.css",
              "vendor/LICENSE-uPlot")
    assert {f"proxy/dashboard/{a}" for a in assets} <= names
    # The page is put together from the zipped wheel's package data (no file of the checkout).
    probe = ("import sys; sys.path.insert(0, sys.argv[1]); import proxy; from proxy.ops.dashboard import page; "
             "assert proxy.__file__.startswith(sys.argv[1]); html = page('N0NCE'); "
             "assert 'uPlot' in html and 'refresh()' in html and '/*SCRIPT*/' not in html; print(len(html))")
    proc = subprocess.run([sys.executable, "-c", probe, str(wheel)], env=_offline_env(tmp_path), cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert int(proc.stdout) > 50_000


def test_wheel_carries_every_package_of_the_tree_and_the_app_imports_from_it(wheel: Path, tmp_path: Path) -> None:
    # A package left out of pyproject's list imports fine from the checkout and crashes the installed
    # proxy at start (it happened: the adapters, Responses and recall packages).
    names = set(zipfile.ZipFile(wheel).namelist())
    packages = sorted(str(p.parent.relative_to(REPO)) for p in (REPO / "proxy").rglob("__init__.py"))
    missing = [p for p in packages if f"{p}/__init__.py" not in names]
    assert not missing, missing
    probe = ("import sys; sys.path.insert(0, sys.argv[1]); import proxy; from proxy.app import create_app; "
             "assert proxy.__file__.startswith(sys.argv[1]); print('ok')")
    proc = subprocess.run([sys.executable, "-c", probe, str(wheel)], env=_offline_env(tmp_path), cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr


def test_the_quick_subsets_slow_files_exist():
    """`scripts/test -m quick` leaves out the files conftest names: a renamed one would silently
    join the quick subset."""
    from conftest import SLOW_FILES

    present = {p.name for p in Path(__file__).resolve().parent.rglob("test_*.py")}
    assert SLOW_FILES and SLOW_FILES <= present, sorted(SLOW_FILES - present)
