"""A custom workflow, loaded with ``explorer.workflow=examples/custom_workflow.py:ReverseWorkflow``.

The task: repeat the prompt's digits in reverse order ("123=" -> "321"). The workflow writes its own reward
(1.0 for the exact reverse, partial credit for the right digits), so it needs no reward function; it asks the
fleet for ``repeat_times`` samples at once and returns one Experience per sample. The explorer adds group ids,
the step number and the task id.
"""

from __future__ import annotations

from trinity_like.common.experience import Experience
from trinity_like.explorer.workflows import Workflow


class ReverseWorkflow(Workflow):
    async def run(self, task, engine, ctx):
        digits = "".join(c for c in task.prompt if c.isdigit())
        target = digits[::-1]
        prompt = ctx.tokenizer.encode(f"reverse {digits}=")
        samples = await engine.generate([prompt] * ctx.repeat_times, ctx.sampling, ctx.seeds)
        out = []
        for s in samples:
            text = ctx.tokenizer.decode(s.response_ids.tolist(), skip_special_tokens=True).strip()
            got = "".join(c for c in text if c.isdigit())
            if got == target:
                reward = 1.0
            else:
                reward = 0.5 * sum(a == b for a, b in zip(got, target, strict=False)) / max(len(target), 1)
            out.append(Experience(prompt_ids=prompt, response_ids=s.response_ids, logprobs=s.logprobs,
                                  reward=reward, model_version=s.model_version, engine_id=s.engine_id,
                                  truncated=s.finish_reason == "length", response_text=text,
                                  info={"target": target}))
        return out
