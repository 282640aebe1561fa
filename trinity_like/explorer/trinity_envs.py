"""Trinity-RFT's environment workflows under their Trinity names: ``frozen_lake_workflow`` (written here, without
gymnasium), and the others registered as refusals that say, when the config loads, which package and data they
need (ALFWorld, SciWorld, WebShop, the email searcher, the agentscope-based agents, and the workflows that need
an auxiliary model as a judge, teacher or reward model).

FrozenLake (upstream ``trinity/common/workflows/envs/frozen_lake``, itself after rLLM and gymnasium's
``FrozenLakeEnv``): a square grid of frozen tiles (``F``), holes (``H``), one start (``S``) and one goal
(``G``). Actions 1 Left, 2 Down, 3 Right, 4 Up (0: invalid, no move). Reaching ``G`` gives reward 1 and ends the
episode, a hole ends it with 0. On a slippery lake the move goes the intended way or either perpendicular way
with probability 1/3 each, drawn from the episode's generator. Maps come from ``raw_task`` (``size``, ``p``,
``seed``: a random map with a path from start to goal of at most ``env_max_steps`` steps) or
``workflow_args.desc``. The random streams are gymnasium's (``numpy.random.default_rng(seed)``, one draw at reset),
so the same seeds give the same maps and slips as Trinity's.

Departure: each turn's ``max_tokens`` is at most the explorer's ``sampling.max_new_tokens`` (Trinity gives a turn
what is left of ``max_response_tokens``, 10,240 by default, which on a CPU engine is minutes per turn); the
total budget is still ``workflow_args.max_response_tokens`` (default 10,240).
"""

from __future__ import annotations

import re

import numpy as np

from trinity_like.explorer.trinity_api import WORKFLOWS, Experience, MultiTurnWorkflow, Task

LEFT, DOWN, RIGHT, UP = 1, 2, 3, 4
"""Trinity's action numbers; 0 is the invalid action."""
_MOVES = {LEFT: (0, -1), DOWN: (1, 0), RIGHT: (0, 1), UP: (-1, 0)}
_GYM = {LEFT: 0, DOWN: 1, RIGHT: 2, UP: 3}
"""Trinity's action -> gymnasium's (0 Left, 1 Down, 2 Right, 3 Up), whose order the slips follow."""
_FROM_GYM = {v: k for k, v in _GYM.items()}
CELL_TEXT = {"P": " P \t", "F": " _ \t", "H": " O \t", "G": " G \t", "X": " X \t", "V": " √ \t"}
"""How the observation draws each cell: player, frozen, hole, goal, player in a hole, player on the goal."""

SYSTEM_PROMPT = """You are Qwen, created by Alibaba Cloud. You are a helpful assistant. You are walking on a frozen lake.

FrozenLake Quick Guide
Goal: Reach the goal (G). Player (P) and Goal (G) must overlap.

Symbols:
_ Frozen | O Hole | G Goal | P Player

Rules:
1. Avoid falling into holes (O).
2. Frozen tiles are slippery, you may move perpendicular to your intended direction.

Valid Action (separated by | ):
Up | Down | Left | Right

Rewards:
Fall into hole: 0
Reach goal: +1.0

You will be provided the current observation, please decide on the next Action.
You should show your thought process and then input the final action in ``` ```.
You should only output the NEXT ACTION at each interation in the ``` ```. For example, if you want to move up, you should output ```Up```.
You should plan ahead and need to achieve it in minimum number of steps.
You should be aware that frozen tiles can be slippery, but the chance is small and you should not overthink it.

Please show your thinking process and put the final action in ``` ```. In every turn, the final action MUST be one of Up, Down, Left, Right.
"""
"""Trinity's FrozenLake system prompt (after RAGEN), word for word: the text its models are trained with."""


def reachable(board: list[list[str]], max_steps: int) -> bool:
    """A path from ``S`` to ``G`` avoiding holes, found by Trinity's depth-first search, which stops exploring
    a branch past ``max_steps`` steps (a tile is visited once, by whichever branch reaches it first)."""
    size = len(board)
    starts = [(r, c) for r in range(size) for c in range(size) if board[r][c] == "S"]
    frontier, seen = [(*starts[0], 0)], set()
    while frontier:
        r, c, steps = frontier.pop()
        if steps > max_steps or (r, c) in seen:
            continue
        seen.add((r, c))
        for dr, dc in ((1, 0), (0, 1), (-1, 0), (0, -1)):
            nr, nc = r + dr, c + dc
            if 0 <= nr < size and 0 <= nc < size:
                if board[nr][nc] == "G":
                    return True
                if board[nr][nc] != "H":
                    frontier.append((nr, nc, steps + 1))
    return False


def random_map(size: int, p: float, seed: int, max_steps: int) -> list[str]:
    """A random ``size`` x ``size`` map, each tile frozen with probability ``p``, random distinct start and goal,
    redrawn until :func:`reachable`; the draws are those of Trinity's ``generate_random_map``."""
    if size < 2:
        raise ValueError(f"a FrozenLake map needs size >= 2 (a start and a goal), got {size}")
    rng = np.random.default_rng(seed)
    p = min(1.0, p)
    while True:
        board = rng.choice(["F", "H"], (size, size), p=[p, 1 - p]).tolist()
        while True:
            sr, sc, gr, gc = (int(rng.integers(0, size)) for _ in range(4))
            if (sr, sc) != (gr, gc):
                break
        board[sr][sc], board[gr][gc] = "S", "G"
        if reachable(board, max_steps):
            return ["".join(row) for row in board]


class FrozenLake:
    """The lake: ``desc`` rows of ``S``/``F``/``H``/``G``; ``reset(seed)``, ``step(action)``, ``render()``."""

    def __init__(self, desc: list[str], is_slippery: bool = False) -> None:
        self.desc = [list(row) for row in desc]
        self.size = len(self.desc)
        self.is_slippery = is_slippery
        self.pos = self._find("S")
        self.rng = np.random.default_rng()

    def _find(self, cell: str) -> tuple[int, int]:
        return next((r, c) for r, row in enumerate(self.desc) for c, v in enumerate(row) if v == cell)

    def reset(self, seed: int | None = None) -> None:
        self.rng = np.random.default_rng(seed)
        self.rng.random()  # gymnasium draws the start from its (one-tile) distribution
        self.pos = self._find("S")

    def cell(self) -> str:
        return self.desc[self.pos[0]][self.pos[1]]

    def finished(self) -> bool:
        return self.cell() in "GH"

    def success(self) -> bool:
        return self.cell() == "G"

    def step(self, action: int) -> tuple[float, bool]:
        """Move by ``action`` (1-4; slipping on a slippery lake); (reward, done)."""
        if self.is_slippery:  # gymnasium: intended-1, intended, intended+1 (its action numbers), 1/3 each
            gym = _GYM[action]
            choices = [(gym - 1) % 4, gym, (gym + 1) % 4]
            pick = int(np.argmax(np.cumsum([1 / 3] * 3) > self.rng.random()))
            action = _FROM_GYM[choices[pick]]
        dr, dc = _MOVES[action]
        self.pos = (min(max(self.pos[0] + dr, 0), self.size - 1), min(max(self.pos[1] + dc, 0), self.size - 1))
        return (1.0 if self.cell() == "G" else 0.0), self.finished()

    def render(self) -> str:
        rows = []
        for r, row in enumerate(self.desc):
            cells = []
            for c, v in enumerate(row):
                if (r, c) == self.pos:
                    v = {"H": "X", "G": "V"}.get(v, "P")
                cells.append(CELL_TEXT["F" if v == "S" else v])
            rows.append("".join(cells))
        return "\n".join(rows)


_DIRECTIONS = {"left": LEFT, "down": DOWN, "right": RIGHT, "up": UP}


def parse_action(response: str) -> int:
    """The action in the last ```...``` block of a response (a direction name in any case, or its number); 0
    (invalid) when there is none."""
    blocks = re.findall(r"```(.*?)```", response, re.DOTALL)
    if not blocks:
        return 0
    text = blocks[-1].strip().lower()
    if text in _DIRECTIONS:
        return _DIRECTIONS[text]
    return int(text) if text.isdigit() and int(text) in _DIRECTIONS.values() else 0


@WORKFLOWS.register_module("frozen_lake_workflow")
class FrozenLakeWorkflow(MultiTurnWorkflow):
    """One episode per run: each turn the model sees the lake and answers with a move; the whole conversation is
    one experience (the model's turns trained on), its reward the sum of the steps' rewards (1 on reaching the
    goal). ``workflow_args``: ``env_max_steps`` (8), ``agent_max_steps`` (10), ``desc`` (a fixed map),
    ``is_slippery`` (false), ``max_response_tokens`` (10,240); ``raw_task``: ``size``, ``p`` (0.8), ``seed``
    (42)."""

    is_async = True

    def __init__(self, *, task: Task, model, auxiliary_models=None) -> None:
        super().__init__(task=task, model=model, auxiliary_models=auxiliary_models)
        args = task.workflow_args or {}
        self.env_max_steps = args.get("env_max_steps", 8)
        self.agent_max_steps = args.get("agent_max_steps", 10)
        self.max_response_tokens = args.get("max_response_tokens", 10240)
        raw = task.raw_task or {}
        self.seed = raw.get("seed", 42)
        desc = args.get("desc") or random_map(raw.get("size", 4), raw.get("p", 0.8), self.seed, self.env_max_steps)
        self.env = FrozenLake(desc, bool(args.get("is_slippery", False)))

    def env_step(self, action: int) -> tuple[str, float, bool, bool]:
        """(observation, reward, done, moved) of one action (0: invalid, no move, reward 0)."""
        if self.env.success():
            return self.env.render(), 1.0, True, False
        if action not in _MOVES:
            return self.env.render(), 0.0, False, False
        before = self.env.pos
        reward, done = self.env.step(action)
        return self.env.render(), reward, done, self.env.pos != before

    async def run_async(self) -> list[Experience]:
        self.env.reset(self.seed)
        observation = self.env.render()
        messages = [{"role": "system", "content": SYSTEM_PROMPT}]
        rewards: list[float] = []
        steps, done, last_observation, acted = 0, False, None, False
        truncate_status = None
        per_turn = self.task.rollout_args.max_tokens
        first_len = 0
        for turn in range(self.agent_max_steps):
            text = (f"Current Observation ({steps}): \n{observation}\n"
                    "You have not achieved the goal, P has not reached G yet. Please give the next action.")
            if steps > 0 and acted and last_observation == observation:
                text += ("\nYour last response is invalid. Your position didn't change at all. You may need to recheck "
                         "your thinking process, action outputted, and the format of response. Remember, you should "
                         "only output the NEXT ACTION at each interation in the ``` ```. For example, if you want to "
                         "move up, you should output ```Up```.")
            if self.agent_max_steps - steps > 0:
                text += f"\nThe maximum number of steps remaining is {self.agent_max_steps - steps}."
            messages.append({"role": "user", "content": text})
            length = await self.model.get_message_token_len(messages)
            if turn == 0:
                first_len = length
            budget = self.max_response_tokens - (length - first_len)
            if budget <= 0:
                messages.pop()
                rewards.append(0.0)
                truncate_status = "response_truncated"
                break
            max_tokens = min(budget, per_turn) if per_turn else budget
            reply = (await self.model.chat_async(messages, n=1, max_tokens=max_tokens))[0].response_text or ""
            messages.append({"role": "assistant", "content": reply})
            action = parse_action(reply)
            acted = True
            last_observation = observation
            observation, reward, done, _ = self.env_step(action)
            rewards.append(reward)
            steps += 1
            if done:
                break
        total = float(sum(rewards))
        return [await self.process_messages_to_experience_async(
            messages, total, {"env_steps": steps, "env_done": 1 if done else 0, "test_score": total},
            truncate_status)]


_ALFWORLD = ("needs the alfworld package and the ALFWorld game files (alfworld-download), which this project does "
             "not install")
REFUSED_WORKFLOWS = {
    "alfworld_workflow": _ALFWORLD,
    "RAFT_alfworld_workflow": _ALFWORLD,
    "RAFT_reflect_alfworld_workflow": _ALFWORLD,
    "step_wise_alfworld_workflow": _ALFWORLD,
    "sciworld_workflow": "needs the scienceworld package (and Java) with its task data, which this project does not "
                         "install",
    "webshop_workflow": "needs a running WebShop server with its product data (the webshop package), which this "
                        "project does not install",
    "email_search_workflow": "needs the Enron email database (the email_searcher data set) and the agentscope "
                             "package, which this project does not install",
    "agentscope_workflow_adapter": "needs the agentscope package, which this project does not install",
    "agentscope_workflow_adapter_v1": "needs the agentscope package, which this project does not install",
    "agentscope_react_workflow": "needs the agentscope package, which this project does not install",
    "as_react_workflow": "needs the agentscope package, which this project does not install",
    "agentscope_react_math_workflow": "needs the agentscope package, which this project does not install",
    "agentscopev0_react_math_workflow": "needs the agentscope package (v0), which this project does not install",
    "agentscope_v1_react_search_workflow": "needs the agentscope package and a search API, which this project does "
                                           "not install",
    "math_rm_workflow": "needs a reward model as an auxiliary model; use reward.reward_model with math_workflow",
    "async_math_rm_workflow": "needs a reward model as an auxiliary model; use reward.reward_model with math_workflow",
    "math_ruler_workflow": "needs an auxiliary judge model (RULER), which this project does not offer to workflows",
    "async_math_ruler_workflow": "needs an auxiliary judge model (RULER), which this project does not offer to "
                                 "workflows",
    "math_trainable_ruler_workflow": "needs an auxiliary judge model (RULER), which this project does not offer to "
                                     "workflows",
    "rubric_judge_workflow": "needs an auxiliary judge model, which this project does not offer to workflows",
    "rubric_judge_openai_workflow": "needs an auxiliary judge model, which this project does not offer to workflows",
    "on_policy_distill_workflow": "needs a teacher as an auxiliary model, which this project does not offer to "
                                  "workflows",
    "on_policy_distill_math_workflow": "needs a teacher as an auxiliary model, which this project does not offer to "
                                       "workflows",
    "simple_mm_workflow": "needs a vision-language model and image inputs, which this project does not support",
    "async_simple_mm_workflow": "needs a vision-language model and image inputs, which this project does not "
                                "support",
    "math_eval_workflow": "is not ported; evaluate with explorer.eval_tasksets (math_workflow's reward)",
    "async_math_eval_workflow": "is not ported; evaluate with explorer.eval_tasksets (math_workflow's reward)",
    "tool_call_workflow": "is not ported; use the tool_agent workflow (explorer.tool_config_path)",
    "sudoku_workflow": "is not ported; copy upstream's envs/sudoku into a plugin folder (explorer.plugin_dirs) with "
                       "its imports changed to trinity_like.explorer.trinity_api",
}
"""Trinity workflow names that cannot run here, and why (what they need)."""

for _name, _why in REFUSED_WORKFLOWS.items():
    WORKFLOWS.refuse(_name, _why)
del _name, _why
