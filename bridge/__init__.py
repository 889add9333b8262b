"""Hand-off to verl: standard artifacts, Parquet both ways, a fail-closed config importer and
a checksummed bundle. Torch-free; imports only ``miniverl.common`` and the environments.
"""
