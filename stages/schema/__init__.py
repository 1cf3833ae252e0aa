"""params.yaml schemas: one module per section (stages/schema/<section>.py), the shared pieces in base.py.

A stage imports only its own section's module, so editing another section's schema re-runs nothing of it
(dvc.yaml lists each stage's code deps). The whole file is validated by stages/params.py.
"""
