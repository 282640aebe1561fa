"""Write warm-up demonstrations for the tool_calculator example: episodes in which the model calls the
calculator on the task, reads its answer and repeats it.

Each line is an Experience row (``prompt_ids``, ``response_ids``, ``action_mask``), built with the
``tool_agent`` workflow's own prompt and tool-response text and answered by the real tool, so the warm-up
trains on exactly the tokens the workflow will show the model::

    prompt     the tool preamble + "\\n" + "23+45="
    response   <tool_call>{"name": "calculator", "arguments": {"expression": "23+45"}}</tool_call><EOS>   (trained)
               \\n<tool_response>68</tool_response>\\n                                              (masked)
               68<EOS>                                                                            (trained)

Chat records (``{"messages": [...]}``) would not do: the warm-up reads those as single-turn.

    .venv/bin/python examples/tool_calculator/make_demonstrations.py   # defaults match config.yaml
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from trinity_like.common.tasks import Task, generate_arithmetic
from trinity_like.common.tiny_model import ensure_tiny_model
from trinity_like.common.tokenizer import hf_tokenizer
from trinity_like.explorer.tool_workflow import episode_prompt, tool_response_text
from trinity_like.explorer.tools import Toolbox, ToolCall, load_tools

HERE = Path(__file__).parent


def demonstration(task: Task, tools: Toolbox, tokenizer) -> dict:
    """One episode: call the calculator on the task's expression, then answer with its result."""
    name = next(s.name for s in tools.specs.values() if s.builtin == "calculator")
    call = ToolCall(name, {"expression": task.prompt.removesuffix("=")})
    result = tools.call(call)  # the real tool answers
    if not result.ok:
        raise ValueError(f"the calculator refused {call.arguments}: {result.text}")
    eos = tokenizer.eos_token_id

    def ids(text: str) -> list[int]:
        return tokenizer.encode(text, add_special_tokens=False)

    call_text = "<tool_call>" + json.dumps({"name": call.name, "arguments": call.arguments}) + "</tool_call>"
    turns = [(ids(call_text) + [eos], True), (ids(tool_response_text([result])), False), (ids(result.text) + [eos], True)]
    return {"task_id": task.task_id, "prompt_ids": tokenizer.encode(episode_prompt(task.prompt, tools)),
            "response_ids": [t for part, _ in turns for t in part],
            "action_mask": [is_model for part, is_model in turns for _ in part],
            "reward": 1.0, "info": {"ground_truth": task.answer, "data_source": "arithmetic"}}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="runs/models/tiny", help="model folder whose tokenizer is used (the tiny "
                   "model is built there if missing)")
    p.add_argument("--tools", default=str(HERE / "tools.yaml"))
    p.add_argument("--out", default="runs/data/tool_calculator/demonstrations.jsonl")
    p.add_argument("--num", type=int, default=256)
    p.add_argument("--max-operand", type=int, default=50)
    p.add_argument("--seed", type=int, default=104_771, help="task seed, apart from the training tasks' (42)")
    args = p.parse_args()
    tokenizer = hf_tokenizer(str(ensure_tiny_model(args.model)))
    tools = load_tools(args.tools)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tasks = generate_arithmetic(args.num, args.max_operand, args.seed)
    out.write_text("".join(json.dumps(demonstration(t, tools, tokenizer)) + "\n" for t in tasks))
    print(f"{len(tasks)} demonstrations written to {out}")


if __name__ == "__main__":
    main()
