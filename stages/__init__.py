"""DeepSeekMath pipeline stages: one module (or package) per dvc.yaml stage, plus shared pieces in core/."""
