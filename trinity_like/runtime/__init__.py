"""The run layer under every part: where a run keeps its files (``paths``), preparing its directory and its
task sets (``run_dir``), a role's metrics writer (``metrics``), the Ray connection (``ray_cluster``), checkpoint
pointers (``checkpoints``) and the schedule that ties explorer steps to trainer steps (``schedule``). It imports
``config`` and ``common`` only; every part may import it, and nothing in it knows who starts a run."""
