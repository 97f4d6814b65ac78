"""The data tests' fixtures (tests/data_fixtures.py: corpora, shards, the GPT-2 vocabulary), for this folder."""

from data_fixtures import corpus, gpt2_bpe_dir, prepared, read_stream, shared_data, wikitext_lines  # noqa: F401
