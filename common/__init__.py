"""Shared, torch-free pieces of miniverl: errors, the recipe schema, the trajectory
data model, tokenizer identity, run directories, manifests and redaction.

Nothing here imports torch at module level; a torch helper that both processes need
(model loading) imports torch inside its function body.
"""
