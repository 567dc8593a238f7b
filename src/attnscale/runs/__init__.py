"""Runs on disk: the record schema, the run store, the sweep runner and its progress.

Every reader and writer of a ``record.json`` goes through ``attnscale.runs.record``."""
