"""Shared pieces every part uses: Experience and its schema, files, tokenizer, tiny model, task sets."""
