"""The trainer: TrainEngineWrapper, the PPO-family step, batching, checkpoints. Never imports the explorer."""
