"""The explorer: rollout engines, workflows and the explore loop. Never imports the trainer."""
