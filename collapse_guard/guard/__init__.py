"""guard part of collapse-guard (see DESIGN.md)."""

__all__: list[str] = []
