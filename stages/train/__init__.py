"""The one training loop shared by the ``pretrain`` and ``sft`` stages.

- :mod:`stages.train.schedule`: the paper's multi-step and constant LR schedules.
- :mod:`stages.train.losses`: token-level cross-entropy (summed, so accumulation weights tokens equally).
- :mod:`stages.train.data`: pretraining mixture stream (packed, resumable) and SFT example packing.
- :mod:`stages.train.checkpoint`: run hashes, atomic resumable checkpoints.
- :mod:`stages.train.ds_config`: DeepSpeed config generated from params.
- :mod:`stages.train.loop`: :func:`train` (plain PyTorch or DeepSpeed engine).
- :mod:`stages.train.report`: TSV curves for DVC plots and PNG figures.
"""
