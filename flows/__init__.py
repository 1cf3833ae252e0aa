"""Thin Prefect 3 flows, one per dvc.yaml stage (``python -m flows.<stage>``), and the pipeline
(``python -m flows.pipeline``).

Importing this package, or any module in it, only defines things: it never changes the environment, starts a
process or a thread, or exits. What a command needs before Prefect is imported (Prefect's home inside the project,
the pipeline's stage server taking the command) is done by the command itself: :func:`flows._common.begin`, called
first thing under ``if __name__ == "__main__"`` in each flow module.
"""
