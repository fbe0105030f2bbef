"""A model's life after training: the MLflow registry and its pyfunc face, the frozen
benchmark, promotion, retrain and the bundled default model. Prints nothing; imports
``core``, ``evaluate`` and ``training``."""

__all__: list[str] = []
