"""trinity_like: an asynchronous off-policy actor-learner system for reinforcement fine-tuning of LMs."""

__version__ = "0.1.0"
