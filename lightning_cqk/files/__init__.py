"""Files, standard library only at import: atomic writes (atomic.py), YAML that refuses duplicate keys
(files/strict_yaml.py), the configs shipped with the package (files/resources.py)."""
