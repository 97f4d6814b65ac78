"""Running a study's runs, resumably, and remembering what computed them (map: study/__init__.py)."""
