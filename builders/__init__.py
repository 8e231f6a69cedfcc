"""Artefact builders per backend (TensorRT-LLM engines, HF-quantised checkpoints) and their serve commands.

Only ``builders.trtllm*`` knows TensorRT-LLM, and it runs ``trtllm-build`` / ``trtllm-serve`` as processes.
"""
