"""A stand-in coding agent for `compaction-proxy wrap` tests: run as `fake_agent.py NAME [ARGS]`
(through a shim named like the real agent on PATH). It finds its provider's base URL the way the
agent NAME reads it (environment variables, or Codex's `-c` overrides), sends one request there with
the real SDK client where the agent uses one, and writes what it saw as JSON to $FAKE_AGENT_REPORT.

$FAKE_AGENT_EXIT: its exit status. $FAKE_AGENT_READY: with it, the agent writes that file and waits
for SIGINT (a Ctrl-C), then sends its requests (the proxy must still serve) and exits 130.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import urllib.request
from typing import Any

VARS = ("OPENAI_BASE_URL", "ANTHROPIC_BASE_URL", "GOOGLE_GEMINI_BASE_URL", "CODE_ASSIST_ENDPOINT", "OPENAI_API_BASE",
        "ANTHROPIC_API_BASE", "OPENAI_HOST", "ANTHROPIC_HOST", "OPENCODE_CONFIG_CONTENT")
KEY = "sk-fake-agent"


def codex_base(args: list[str]) -> str:
    settings = dict(args[i + 1].split("=", 1) for i, a in enumerate(args) if a == "-c")
    provider = json.loads(settings["model_provider"])
    return json.loads(settings[f"model_providers.{provider}.base_url"])


def openai_chat(base: str) -> dict[str, Any]:
    import openai

    raw = openai.OpenAI(base_url=base, api_key=KEY, max_retries=0).chat.completions.with_raw_response.create(
        model="gpt-4o", messages=[{"role": "user", "content": "hello"}])
    return {"status": raw.http_response.status_code, "compaction": raw.headers.get("x-compaction-status"),
            "text": raw.parse().choices[0].message.content}


def openai_responses(base: str) -> dict[str, Any]:
    import openai

    raw = openai.OpenAI(base_url=base, api_key=KEY, max_retries=0).responses.with_raw_response.create(
        model="gpt-5.5", input="hello")
    return {"status": raw.http_response.status_code, "compaction": raw.headers.get("x-compaction-status"),
            "text": raw.parse().output_text}


def anthropic_messages(base: str) -> dict[str, Any]:
    import anthropic

    raw = anthropic.Anthropic(base_url=base, api_key=KEY, max_retries=0).messages.with_raw_response.create(
        model="claude-sonnet-4-5", max_tokens=64, messages=[{"role": "user", "content": "hello"}])
    return {"status": raw.http_response.status_code, "compaction": raw.headers.get("x-compaction-status"),
            "text": raw.parse().content[0].text}


def gemini(base: str) -> dict[str, Any]:
    body = {"contents": [{"role": "user", "parts": [{"text": "hello"}]}]}
    return _post(f"{base}/v1beta/models/gemini-2.5-pro:generateContent", body, {"x-goog-api-key": "gemini-key"})


def code_assist(endpoint: str) -> dict[str, Any]:
    """Gemini CLI signed in with Google: its first call, an account call, to CODE_ASSIST_ENDPOINT."""
    body = {"metadata": {"ideType": "IDE_UNSPECIFIED", "pluginType": "GEMINI"}}
    return _post(f"{endpoint}/v1internal:loadCodeAssist", body, {"Authorization": "Bearer ya29.fake-agent"})


def _post(url: str, body: dict[str, Any], headers: dict[str, str]) -> dict[str, Any]:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json", **headers})
    with urllib.request.urlopen(req, timeout=30) as resp:
        return {"status": resp.status, "text": json.loads(resp.read())["text"]}


def requests_for(name: str, args: list[str], env: dict[str, str]) -> dict[str, Any]:
    """The agent's requests, each to the base URL it reads as that agent does."""
    if name == "claude":
        import anthropic

        return {"messages": anthropic_messages(str(anthropic.Anthropic(api_key=KEY).base_url))}  # env's base
    if name == "codex":
        return {"responses": openai_responses(codex_base(args))}
    if name == "gemini":
        return {"gemini": gemini(env["GOOGLE_GEMINI_BASE_URL"]), "code_assist": code_assist(env["CODE_ASSIST_ENDPOINT"])}
    if name == "opencode":
        providers = json.loads(env["OPENCODE_CONFIG_CONTENT"])["provider"]
        return {"chat": openai_chat(providers["openai"]["options"]["baseURL"]),
                "messages": anthropic_messages(providers["anthropic"]["options"]["baseURL"].removesuffix("/v1"))}
    if name == "aider":
        return {"chat": openai_chat(env["OPENAI_API_BASE"]), "messages": anthropic_messages(env["ANTHROPIC_API_BASE"])}
    if name == "goose":
        return {"chat": openai_chat(env["OPENAI_HOST"] + "/v1"), "messages": anthropic_messages(env["ANTHROPIC_HOST"])}
    import anthropic
    import openai

    return {"chat": openai_chat(str(openai.OpenAI(api_key=KEY).base_url)),  # OPENAI_BASE_URL, as the SDK reads it
            "messages": anthropic_messages(str(anthropic.Anthropic(api_key=KEY).base_url)),
            "gemini": gemini(env["GOOGLE_GEMINI_BASE_URL"]), "code_assist": code_assist(env["CODE_ASSIST_ENDPOINT"])}


def main() -> int:
    name, args = sys.argv[1], sys.argv[2:]
    env = dict(os.environ)
    report: dict[str, Any] = {"name": name, "args": args, "env": {k: env[k] for k in VARS if k in env}}
    ready = env.get("FAKE_AGENT_READY")
    if ready:
        interrupted = threading.Event()
        signal.signal(signal.SIGINT, lambda *_: (report.__setitem__("sigints", report.get("sigints", 0) + 1),
                                                 interrupted.set()))
        open(ready, "w").close()
        interrupted.wait(60)
    report["requests"] = requests_for(name, args, env)
    with open(env["FAKE_AGENT_REPORT"], "w") as f:
        json.dump(report, f)
    return 130 if ready else int(env.get("FAKE_AGENT_EXIT", "0"))


if __name__ == "__main__":
    sys.exit(main())
