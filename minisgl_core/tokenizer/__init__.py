"""Tokenizer loading, chat templates and (incremental) detokenization."""
