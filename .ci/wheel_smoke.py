"""CI: the installed wheel serves. Run with the python of a venv the wheel was installed into.

Starts the packaged fake upstream (proxy.fakes.chat) in a thread and the venv's own
`compaction-proxy` console script as a process (no TIKTOKEN_CACHE_DIR, downloads impossible),
sends a chat request, then a long conversation that must come back `summarized`; then runs the
installed `compaction-proxy fake-upstream` and a command under `compaction-proxy wrap`. Exits non-zero,
with the reason, on any failure. Standard library only besides the installed package.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

MODEL = "smoke-model"
WINDOW = 4000  # threshold 3400: the long conversation below crosses it


def fail(msg: str) -> None:
    print(f"wheel smoke: FAILED: {msg}", file=sys.stderr)
    sys.exit(1)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(url: str, body: dict) -> tuple[int, dict[str, str], dict]:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json", "Authorization": "Bearer sk-smoke"})
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status, {k.lower(): v for k, v in resp.headers.items()}, json.loads(resp.read())
    except urllib.error.HTTPError as e:
        fail(f"HTTP {e.code}: {e.read()[:500]!r}")
        raise


def long_conversation() -> list[dict]:
    words = "alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike".split()
    msgs = [{"role": "system", "content": "You are a helpful agent."}]
    for t in range(12):
        text = " ".join(words[(t + j) % len(words)] for j in range(160))
        msgs += [{"role": "user", "content": f"step {t}: {text}"}, {"role": "assistant", "content": f"done {t}: {text}"}]
    msgs.append({"role": "user", "content": "What next?"})
    return msgs


AGENT = r"""
import json, os, sys, urllib.request
req = urllib.request.Request(os.environ["OPENAI_BASE_URL"] + "/chat/completions", method="POST",
                             data=json.dumps({"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]}).encode(),
                             headers={"Content-Type": "application/json", "Authorization": "Bearer sk-smoke"})
opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # (HTTP_PROXY points nowhere here)
with opener.open(req, timeout=30) as resp:
    ok = resp.headers["x-compaction-status"] == "none" and json.loads(resp.read())["choices"][0]["message"]["content"]
sys.exit(7 if ok else 1)
"""


def commands(env: dict[str, str], work: Path) -> None:
    """The installed `compaction-proxy fake-upstream` serves, and `compaction-proxy wrap -- CMD`
    runs a command through a proxy of its own to it and returns the command's status."""
    script = Path(sys.executable).with_name("compaction-proxy")
    fake = subprocess.Popen([str(script), "fake-upstream", "--protocol", "chat"], cwd=work, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = fake.stdout.readline() if fake.stdout else ""
        if not line.startswith("fake chat upstream on http://127.0.0.1:"):
            fail(f"fake-upstream printed {line!r}; stderr {fake.stderr.read() if fake.poll() is not None else ''}")
        url = line.split(" on ", 1)[1].split()[0]
        wrap = subprocess.run([str(script), "wrap", "--upstream", url, "--", sys.executable, "-c", AGENT], cwd=work,
                              env={**env, "XDG_CACHE_HOME": str(work / "cache")}, capture_output=True, text=True,
                              timeout=120)
        if wrap.returncode != 7 or "compaction-proxy wrap: " not in wrap.stderr:
            fail(f"wrap -- CMD exited {wrap.returncode} (want the command's 7):\n{wrap.stderr}")
    finally:
        fake.terminate()
        fake.wait(30)


def main() -> None:
    started = float(sys.argv[1]) if len(sys.argv) > 1 else time.time()  # when `pip install` began
    import proxy
    from proxy.fakes.chat import FakeUpstream

    if "site-packages" not in proxy.__file__:
        fail(f"proxy imported from {proxy.__file__}, not from the installed wheel")
    script = Path(sys.executable).with_name("compaction-proxy")
    work = Path(tempfile.mkdtemp(prefix="wheel-smoke-"))
    (work / "proxy.yaml").write_text(f"models:\n  {MODEL}:\n    context_window: {WINDOW}\nstore:\n  url: memory://\n"
                                     "compaction:\n  prepare_percent: 0\n")
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("TIKTOKEN_CACHE_DIR", "DATA_GYM_CACHE_DIR")}
    env.update(TMPDIR=str(work), HTTPS_PROXY="http://127.0.0.1:9", HTTP_PROXY="http://127.0.0.1:9", NO_PROXY="")
    with FakeUpstream(reply="pong") as fake:
        proc = subprocess.Popen([str(script), "--config", str(work / "proxy.yaml"), "--port", str(port),
                                 "--upstream", fake.base_url], cwd=work, env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            base = f"http://127.0.0.1:{port}"
            deadline = time.time() + 30
            while True:
                try:
                    with urllib.request.urlopen(base + "/healthz", timeout=2):
                        break
                except OSError:
                    if proc.poll() is not None or time.time() > deadline:
                        out = proc.communicate(timeout=5)[0] if proc.poll() is not None else ""
                        fail(f"compaction-proxy did not come up:\n{out}")
                    time.sleep(0.1)
            status, headers, answer = post(base + "/v1/chat/completions",
                                           {"model": MODEL, "messages": [{"role": "user", "content": "ping"}]})
            first = time.time()
            if answer["choices"][0]["message"]["content"] != "pong" or headers.get("x-compaction-status") != "none":
                fail(f"chat: unexpected answer {answer} / {headers}")
            history = long_conversation()
            status, headers, answer = post(base + "/v1/chat/completions", {"model": MODEL, "messages": history})
            if headers.get("x-compaction-status") != "summarized":
                fail(f"long conversation: x-compaction-status {headers.get('x-compaction-status')!r}, want summarized")
            before, after = int(headers["x-compaction-tokens-before"]), int(headers["x-compaction-tokens-after"])
            if not (after < WINDOW * 0.85 < before) or not fake.summarizer_requests:
                fail(f"long conversation: {before} -> {after} tokens, {len(fake.summarizer_requests)} summaries")
            if len(fake.chat_requests[-1]["messages"]) >= len(history):
                fail("the forwarded request is not the compacted one")
        finally:
            proc.terminate()
            out = proc.communicate(timeout=30)[0]
    if proc.returncode != 0:
        fail(f"compaction-proxy exited {proc.returncode}:\n{out}")
    if "estimated as bytes/4" in out or "Traceback" in out:
        fail(f"the proxy's log shows a problem:\n{out}")
    commands(env, work)
    print(f"wheel smoke: ok; chat answered {first - started:.1f} s after pip install began; "
          f"long conversation summarized, {before} -> {after} tokens; fake-upstream and wrap ran")


if __name__ == "__main__":
    main()
