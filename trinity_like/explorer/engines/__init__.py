"""Rollout engines. ``hf`` runs on CPU with transformers; ``vllm`` (GPU) arrives with part D."""
