"""Shared, torch-free pieces of miniverl: errors, the recipe schema (``recipe`` with its
sections in ``recipe_sections`` and ``recipe_models``, YAML errors in ``recipe_io``), the
trajectory data model, tokenizer identity, run directories, manifests, redaction,
hashing (files, trees, canonical JSON, ``SHA256SUMS``), atomic writes and timestamps.

Nothing here imports torch at module level; a torch helper that both processes need
(model loading) imports torch inside its function body.
"""
