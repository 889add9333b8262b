"""The wire protocol mvl-score/1: message models, frame codec, async client, limits.

Torch-free. Spec: docs/protocol.md.
"""
