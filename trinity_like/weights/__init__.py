"""Weight delivery in one place: how a policy version travels from the trainer to the engines.

- ``messages``: what crosses process boundaries: the published version (``WeightsInfo``), a broadcast round
  (``BroadcastRound``), the actors' names;
- ``fingerprint``: the checksum of a version, computed where the tensors are;
- ``files``: version folders (method ``checkpoint``): parts, manifest, pointer, pruning;
- ``shared``: shared buffers on one node (method ``ipc``): ``/dev/shm`` files or CUDA IPC handles as plain data;
- ``broadcast``: collective broadcast rounds (method ``broadcast``) and the flat packing the shared buffers use;
- ``publish``: the trainer's side, one publisher per method;
- ``receive``: the explorer's side, one receiver per method, which the fleet asks to bring an engine to a version.

The actors that coordinate it (Synchronizer, CheckpointMonitor) are ``trinity_like.synchronizer``.
"""
