"""Quantisation with NVIDIA ModelOpt: recipes, calibration data, export, quality report.

The only package that imports torch and ModelOpt, always lazily inside functions, so ``import quantization``
works on a machine without them.
"""
