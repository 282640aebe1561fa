"""Write warm-up demonstrations for the tool_calculator example: a mix of episodes that call the calculator
and repeat its answer and episodes that answer directly, by heart.

Each line is an Experience row (``prompt_ids``, ``response_ids``, ``action_mask``), built with the
``tool_agent`` workflow's own prompt and tool-response text and answered by the real tool, so the warm-up
trains on exactly the tokens the workflow will show the model. A tool episode::

    prompt     the tool preamble + "\\n" + "523+845="
    response   <tool_call>{"name": "calculator", "arguments": {"expression": "523+845"}}</tool_call><EOS>
                                                                                        (trained)
               \\n<tool_response>1368</tool_response>\\n                            (masked)
               1368<EOS>                                                            (trained)

and a direct episode, one model turn with the right answer and no call::

    prompt     the tool preamble + "\\n" + "523+845="
    response   1368<EOS>                                                            (trained)

Both kinds are correct, so the warm-up teaches both behaviours and to call the tool in about
``--tool-fraction`` of the episodes. The tiny model cannot add 3-digit numbers by heart, so after the warm-up
its direct answers are mostly wrong and its calls mostly right: that is the gap RL (GRPO) has to find.

Chat records (``{"messages": [...]}``) would not do: the warm-up reads those as single-turn.

    .venv/bin/python examples/tool_calculator/make_demonstrations.py   # defaults match config.yaml

Options: ``--num`` episodes (256); ``--tool-fraction`` of them that call the calculator (0.3; 1.0 is the
former all-tool warm-up, after which the reward starts high and RL has little to add); ``--max-operand``
(999, as ``explorer.taskset.max_operand`` and the eval set's); ``--seed`` of the tasks and of which
episodes call the tool.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

from trinity_like.common.tasks import Task, generate_arithmetic
from trinity_like.common.tiny_model import ensure_tiny_model
from trinity_like.common.tokenizer import hf_tokenizer
from trinity_like.explorer.tool_workflow import episode_prompt, tool_response_text
from trinity_like.explorer.tools import Toolbox, ToolCall, load_tools

HERE = Path(__file__).parent


def demonstration(task: Task, tools: Toolbox, tokenizer, use_tool: bool) -> dict:
    """One episode: call the calculator on the task's expression, then answer with its result (``use_tool``),
    or answer directly with the task's answer."""
    eos = tokenizer.eos_token_id

    def ids(text: str) -> list[int]:
        return tokenizer.encode(text, add_special_tokens=False)

    if use_tool:
        name = next(s.name for s in tools.specs.values() if s.builtin == "calculator")
        call = ToolCall(name, {"expression": task.prompt.removesuffix("=")})
        result = tools.call(call)  # the real tool answers
        if not result.ok or result.text != task.answer:
            raise ValueError(f"the calculator answered {call.arguments} with {result.text!r}, "
                             f"not {task.answer}")
        call_json = json.dumps({"name": call.name, "arguments": call.arguments})
        call_text = f"<tool_call>{call_json}</tool_call>"
        turns = [(ids(call_text) + [eos], True), (ids(tool_response_text([result])), False),
                 (ids(result.text) + [eos], True)]
    else:
        turns = [(ids(task.answer) + [eos], True)]
    return {"task_id": task.task_id, "prompt_ids": tokenizer.encode(episode_prompt(task.prompt, tools)),
            "response_ids": [t for part, _ in turns for t in part],
            "action_mask": [is_model for part, is_model in turns for _ in part],
            "reward": 1.0, "info": {"ground_truth": task.answer, "data_source": "arithmetic",
                                    "tool_call": use_tool}}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="runs/models/tiny",
                   help="model folder whose tokenizer is used (the tiny model is built there if missing)")
    p.add_argument("--tools", default=str(HERE / "tools.yaml"))
    p.add_argument("--out", default="runs/data/tool_calculator/demonstrations.jsonl")
    p.add_argument("--num", type=int, default=256, help="episodes to write")
    p.add_argument("--tool-fraction", type=float, default=0.3,
                   help="fraction of the episodes that call the calculator; the others answer directly")
    p.add_argument("--max-operand", type=int, default=999, help="operands are drawn from 0..max-operand")
    p.add_argument("--seed", type=int, default=104_771, help="task seed, apart from the training tasks' (42)")
    args = p.parse_args()
    if not 0.0 <= args.tool_fraction <= 1.0:
        p.error(f"--tool-fraction must be in [0, 1], got {args.tool_fraction}")
    tokenizer = hf_tokenizer(str(ensure_tiny_model(args.model)))
    tools = load_tools(args.tools)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tasks = generate_arithmetic(args.num, args.max_operand, args.seed)
    # exactly round(num * fraction) tool episodes, at random places
    num_tool = round(len(tasks) * args.tool_fraction)
    tool_ids = set(random.Random(args.seed).sample(range(len(tasks)), num_tool))
    out.write_text("".join(json.dumps(demonstration(t, tools, tokenizer, i in tool_ids)) + "\n"
                           for i, t in enumerate(tasks)))
    print(f"{len(tasks)} demonstrations written to {out}: {num_tool} call the calculator, "
          f"{len(tasks) - num_tool} answer directly")


if __name__ == "__main__":
    main()
