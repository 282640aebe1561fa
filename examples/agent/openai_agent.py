"""An agent on the official `openai` client, attached to `trinity-like serve`.

For each arithmetic task it runs `--attempts` conversations of two turns with a calculator tool: it asks,
answers a tool call if the model makes one, asks for the final answer, scores it (1 if the right number is
in the last reply), sends the reward (`POST /v1/feedback`) and finally commits every rewarded conversation
into the run's buffer (`POST /v1/commit`). The attempts at one task share a `group_id`, so GRPO compares them.

    python examples/agent/openai_agent.py --base-url http://127.0.0.1:8000/v1 --tasks 4 --attempts 4

(The tiny demo model answers at random; a real model behind `serve` makes the same calls meaningful.)
"""

from __future__ import annotations

import argparse
import json
import random
import re
import urllib.request

from openai import OpenAI

CALCULATOR = {"type": "function", "function": {
    "name": "add", "description": "Add two integers.",
    "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                   "required": ["a", "b"]}}}


def post(base_url: str, path: str, body: dict, api_key: str) -> dict:
    """The recording API is plain JSON over HTTP (the openai client has no call for it)."""
    req = urllib.request.Request(base_url + path, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json", "Authorization": f"Bearer {api_key}"})
    with urllib.request.urlopen(req, timeout=60) as resp:
        return json.load(resp)


def attempt(client: OpenAI, a: int, b: int, session: str, group: str) -> tuple[str, int, float]:
    """One conversation; returns (experience id, the served policy version, reward)."""
    extra = {"session_id": session, "group_id": group}
    messages = [{"role": "system", "content": "You can call the add tool."},
                {"role": "user", "content": f"What is {a} + {b}?"}]
    reply = client.chat.completions.create(model="policy", messages=messages, tools=[CALCULATOR], max_tokens=16,
                                           extra_body=extra)
    msg = reply.choices[0].message
    messages.append(msg.model_dump(exclude_none=True, include={"role", "content", "tool_calls"}))
    for call in msg.tool_calls or []:  # run the tool the model asked for, give it the answer
        try:
            args = json.loads(call.function.arguments)
            result = str(int(args["a"]) + int(args["b"]))
        except (ValueError, KeyError, TypeError):
            result = "error: add takes integers a and b"
        messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    messages.append({"role": "user", "content": "Your final answer, as a number?"})
    # the same tools on every turn: a conversation whose tools (or history) change goes on in a new experience
    final = client.chat.completions.create(model="policy", messages=messages, tools=[CALCULATOR], max_tokens=8,
                                           extra_body=extra)
    text = final.choices[0].message.content or ""
    reward = 1.0 if str(a + b) in re.findall(r"-?\d+", text) else 0.0
    assert final.model_extra["experience_id"] == reply.model_extra["experience_id"]  # one experience, two turns
    return final.model_extra["experience_id"], final.model_extra["model_version"], reward


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", default="http://127.0.0.1:8000/v1")
    parser.add_argument("--api-key", default="none")
    parser.add_argument("--tasks", type=int, default=4)
    parser.add_argument("--attempts", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    client = OpenAI(base_url=args.base_url, api_key=args.api_key)
    rng = random.Random(args.seed)
    rewards, versions = [], set()
    for t in range(args.tasks):
        a, b = rng.randint(0, 9), rng.randint(0, 9)
        group = f"task-{args.seed}-{t}"
        for k in range(args.attempts):
            eid, version, reward = attempt(client, a, b, f"{group}-attempt-{k}", group)
            post(args.base_url, "/feedback", {"experience_id": eid, "reward": reward}, args.api_key)
            rewards.append(reward)
            versions.add(version)
    done = post(args.base_url, "/commit", {}, args.api_key)
    print(f"{len(rewards)} conversations, mean reward {sum(rewards) / len(rewards):.3f}, served versions "
          f"{sorted(versions)}; committed {done['committed']} into segment {done['segment']}")


if __name__ == "__main__":
    main()
