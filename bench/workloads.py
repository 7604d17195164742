"""Request bodies for the benchmark workloads: small requests and long agent conversations.

A conversation is a system prompt and a list of turns (a user message, then the assistant's tool
call, the tool's result and the assistant's answer). Request k carries every turn before k in full
plus the user message of turn k, so request k+1 is request k plus one turn, as an agent sends it.
Messages are serialized once; bodies are spliced from those bytes so that building a
multi-megabyte request costs a copy, not a JSON dump.
"""

from __future__ import annotations

import random

import orjson

SYSTEM_PROMPT = (
    "You are a customer-service agent for an airline. Use the tools to look up reservations, "
    "follow the policy exactly, and confirm every change with the user before making it."
)
_WORDS = (
    "the of and to in is that for it with as was on be by at this are from or an which have not but "
    "all were when we there can more if will one about up out their so what into time has them some "
    "could these other than then now its only new also any after first well way even because most "
    "us two how our work make back use just over such through years where much those see order "
    "booking flight customer account refund status search result error file path function class "
    "module request response value table column index record update delete create config service "
    "server client cache token message summary history tool call user assistant system"
).split()


def words(rng: random.Random, n: int) -> str:
    """About `n` tokens of text (these words are one cl100k/o200k token each)."""
    return " ".join(rng.choices(_WORDS, k=n))


def _msg(msg: dict[str, object]) -> bytes:
    return orjson.dumps(msg)


def small_body(model: str, *, stream: bool = False) -> bytes:
    """A short chat request (two messages, about 40 tokens)."""
    head = {"stream": True} if stream else {}  # `stream` first: the fake upstream looks at the ends only
    return orjson.dumps(
        {
            **head,
            "model": model,
            "messages": [
                {"role": "system", "content": "You are a helpful assistant. Answer in one short sentence."},
                {"role": "user", "content": "What is the capital of France, and what river runs through it?"},
            ],
            "max_tokens": 64,
        }
    )


def agent_tools(count: int = 12) -> list[dict[str, object]]:
    """Function schemas like an airline agent's (about 200 tokens each): agents send them every request."""
    rng = random.Random(99)
    tools: list[dict[str, object]] = []
    for i in range(count):
        params = {f"arg_{j}": {"type": "string", "description": words(rng, 15)} for j in range(4)}
        tools.append({
            "type": "function",
            "function": {
                "name": f"airline_tool_{i}",
                "description": words(rng, 80),
                "parameters": {"type": "object", "properties": params, "required": ["arg_0"]},
            },
        })
    return tools


class Conversation:
    """A growing agent conversation; `body(k)` is request k (turns before k, then user message k)."""

    def __init__(self, model: str, tools: list[dict[str, object]] | None = None) -> None:
        self.head = b'{"model":' + orjson.dumps(model)
        if tools:
            self.head += b',"tools":' + orjson.dumps(tools)
        self.head += b',"messages":[' + _msg({"role": "system", "content": SYSTEM_PROMPT})
        self.users: list[bytes] = []  # turn i's user message
        self.rests: list[bytes] = []  # turn i's other messages, comma-joined (may be empty)
        self._prefix = b""  # turns [0, _prefix_turns) joined, each preceded by a comma
        self._prefix_turns = 0

    def __len__(self) -> int:
        return len(self.users)

    def add_turn(self, user: str, rest: list[dict[str, object]]) -> None:
        self.users.append(_msg({"role": "user", "content": user}))
        self.rests.append(b",".join(_msg(m) for m in rest))

    def _full_turn(self, i: int) -> bytes:
        return b"," + self.users[i] + (b"," + self.rests[i] if self.rests[i] else b"")

    def body(self, k: int) -> bytes:
        """Request k (0-based): turns 0..k-1 in full plus turn k's user message."""
        if k < self._prefix_turns:  # going back: rebuild from the start
            self._prefix, self._prefix_turns = b"", 0
        if k > self._prefix_turns:
            self._prefix += b"".join(self._full_turn(i) for i in range(self._prefix_turns, k))
            self._prefix_turns = k
        return self.head + self._prefix + b"," + self.users[k] + b"]}"


def agent_turn(rng: random.Random, turn: int, tokens: int) -> tuple[str, list[dict[str, object]]]:
    """One agent turn of about `tokens` tokens: 10% request, 70% tool output, 20% answers."""
    call_id = f"call_{rng.getrandbits(48):012x}"
    order = f"#W{rng.randrange(10**6, 10**7)}"
    user = f"Turn {turn}: please check order {order}. " + words(rng, max(1, tokens // 10))
    result = (
        f'{{"order_id": "{order}", "status": "pending", "user_id": "user_{rng.randrange(10**4)}", '
        f'"notes": "{words(rng, max(1, tokens * 7 // 10))}"}}'
    )
    rest: list[dict[str, object]] = [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": call_id,
                    "type": "function",
                    "function": {"name": "get_order_details", "arguments": orjson.dumps({"order_id": order}).decode()},
                }
            ],
        },
        {"role": "tool", "tool_call_id": call_id, "content": result},
        {"role": "assistant", "content": f"Order {order} is pending. " + words(rng, max(1, tokens // 5))},
    ]
    return user, rest


def short_turn(rng: random.Random, turn: int) -> tuple[str, list[dict[str, object]]]:
    """A short exchange (about 60 tokens): a question and a plain answer."""
    return f"Follow-up {turn}: " + words(rng, 20), [{"role": "assistant", "content": "Noted. " + words(rng, 30)}]


def agent_conversation(model: str, *, seed: int, turns: int, turn_tokens: int, short_turns: int = 0) -> Conversation:
    """`turns` agent turns of about `turn_tokens` tokens, then `short_turns` short exchanges; with tools."""
    rng = random.Random(seed)
    conv = Conversation(model, agent_tools())
    for t in range(turns):
        conv.add_turn(*agent_turn(rng, t, turn_tokens))
    for t in range(short_turns):
        conv.add_turn(*short_turn(rng, t))
    return conv


# -- the same requests in the other protocols ------------------------------------------------------

SMALL_SYSTEM = "You are a helpful assistant. Answer in one short sentence."
SMALL_QUESTION = "What is the capital of France, and what river runs through it?"


GEMINI_KEY = {"x-goog-api-key": "bench-key"}  # the client's own key: the proxy adds none


def protocol_path(protocol: str, model: str, *, stream: bool = False) -> str:
    """Where a protocol's request goes: Gemini names its model and whether it streams in the path."""
    if protocol == "gemini":
        return f"/v1beta/models/{model}:" + ("streamGenerateContent?alt=sse" if stream else "generateContent")
    return {"chat": "/v1/chat/completions", "messages": "/v1/messages", "responses": "/v1/responses"}[protocol]


def gemini_tools(tools: list[dict[str, object]]) -> list[dict[str, object]]:
    """Chat's function schemas as one Gemini Tool of functionDeclarations."""
    return [{"functionDeclarations": [{k: f["function"][k] for k in ("name", "description", "parameters")}  # type: ignore[index]
                                      for f in tools]}]


def gemini_turn(name: str, args: str, output: str, answer: str) -> list[dict[str, object]]:
    """An agent's call, its result and the answer as Gemini contents (the API's functionCall carries
    no id; the response names its call)."""
    return [{"role": "model", "parts": [{"functionCall": {"name": name, "args": orjson.loads(args)}}]},
            {"role": "user", "parts": [{"functionResponse": {"name": name, "response": {"output": output}}}]},
            {"role": "model", "parts": [{"text": answer}]}]


def gemini_user(text: str) -> dict[str, object]:
    return {"role": "user", "parts": [{"text": text}]}


def small_protocol_body(protocol: str, model: str, *, stream: bool = False) -> bytes:
    """small_body's request as `chat`, `messages` (Anthropic), `responses` (OpenAI Responses) or
    `gemini` (its streaming is in the path: protocol_path)."""
    if protocol == "chat":
        return small_body(model, stream=stream)
    if protocol == "gemini":
        return orjson.dumps({"systemInstruction": {"parts": [{"text": SMALL_SYSTEM}]},
                             "contents": [gemini_user(SMALL_QUESTION)], "generationConfig": {"maxOutputTokens": 64}})
    head = {"stream": True} if stream else {}
    if protocol == "messages":
        return orjson.dumps({**head, "model": model, "max_tokens": 64, "system": SMALL_SYSTEM,
                             "messages": [{"role": "user", "content": SMALL_QUESTION}]})
    return orjson.dumps({**head, "model": model, "instructions": SMALL_SYSTEM, "input": SMALL_QUESTION,
                         "max_output_tokens": 64})


def agent_protocol_body(protocol: str, model: str, *, seed: int, turns: int, turn_tokens: int,
                        stream: bool = False) -> bytes:
    """agent_conversation's request after `turns` turns, as Messages (tool_use / tool_result
    blocks), Responses (function_call / function_call_output items) or Gemini (functionCall /
    functionResponse parts): the same text and tools."""
    rng = random.Random(seed)
    tools = agent_tools()
    head = {"stream": True} if stream else {}
    items: list[dict[str, object]] = []
    for t in range(turns + 1):
        user, rest = agent_turn(rng, t, turn_tokens)
        items.append(gemini_user(user) if protocol == "gemini" else {"role": "user", "content": user})
        if t == turns:
            break
        call = rest[0]["tool_calls"][0]  # type: ignore[index]
        result, answer = rest[1]["content"], rest[2]["content"]
        fn = call["function"]
        if protocol == "gemini":
            items += gemini_turn(fn["name"], fn["arguments"], result, answer)  # type: ignore[arg-type]
        elif protocol == "messages":
            items += [{"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_" + call["id"][5:],
                                                         "name": fn["name"], "input": orjson.loads(fn["arguments"])}]},
                      {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_" + call["id"][5:],
                                                    "content": result}]},
                      {"role": "assistant", "content": answer}]
        else:
            items += [{"type": "function_call", "call_id": call["id"], "name": fn["name"], "arguments": fn["arguments"]},
                      {"type": "function_call_output", "call_id": call["id"], "output": result},
                      {"role": "assistant", "content": answer}]
    if protocol == "messages":
        schemas = [{"name": f["function"]["name"], "description": f["function"]["description"],  # type: ignore[index]
                    "input_schema": f["function"]["parameters"]} for f in tools]  # type: ignore[index]
        return orjson.dumps({**head, "model": model, "max_tokens": 1024, "system": SYSTEM_PROMPT, "tools": schemas,
                             "messages": items})
    if protocol == "gemini":
        return orjson.dumps({"systemInstruction": {"parts": [{"text": SYSTEM_PROMPT}]}, "tools": gemini_tools(tools),
                             "contents": items})
    schemas = [{"type": "function", **f["function"]} for f in tools]  # type: ignore[dict-item]
    return orjson.dumps({**head, "model": model, "instructions": SYSTEM_PROMPT, "tools": schemas, "input": items})
