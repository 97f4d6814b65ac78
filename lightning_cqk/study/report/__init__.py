"""What a reader sees: the report read, rendered and written, committed results, figures (map: study/__init__.py)."""
