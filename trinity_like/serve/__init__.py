"""The OpenAI-compatible recording endpoint (``trinity-like serve``): agents built on any framework talk to
the current policy through it, and their conversations become experiences (``source: agent``) once rewarded
and committed. ``app.py`` holds the HTTP API, ``records.py`` the pending records, ``server.py`` the role."""
