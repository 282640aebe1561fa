# ruff: noqa  (a user's file, kept as upstream wrote it: README.md)
from trinity_like.explorer.trinity_api import ModelWrapper, Task, Workflow


class APIWorkflow(Workflow):
    is_async: bool = True

    def __init__(self, model: ModelWrapper, task: Task, auxiliary_models=None):
        super().__init__(task=task, model=model, auxiliary_models=auxiliary_models)
        self.client = model.get_openai_async_client()
        self.raise_except = task.raw_task.get("raise_except", False)

    async def run_async(self):
        _ = await self.client.chat.completions.create(
            model=self.client.model_path,
            messages=[{"role": "user", "content": "Hello!"}],
        )
        if self.raise_except:
            raise RuntimeError("Intentional Exception for testing.")
        exps = self.model.extract_experience_from_history()
        exps[0].reward = 0.5
        return exps

