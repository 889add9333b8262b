"""The wire protocol mvl-score/1: message models, frame codec, async client, server transport, limits.

Torch-free. Spec: DESIGN.md section 3.
"""
