"""Checkpoints: Hub repos pinned to a commit, local directories, and the Hugging Face cache layout."""
