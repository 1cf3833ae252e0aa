"""The ``evaluate`` stage: every model on the held-out problems (and GSM8K / MATH when given), CoT / PoT /
TIR, greedy accuracy, pass@k and maj@k, per benchmark and difficulty. See :mod:`stages.evaluate.stage`."""
