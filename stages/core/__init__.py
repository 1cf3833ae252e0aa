"""Shared pieces used by several stages: errors, atomic I/O, paths, prompts, model I/O,
generation backends, answer checking and the code sandbox. Each lives in exactly one module here."""
