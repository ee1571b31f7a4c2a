"""libcuda_limiter.so: per-pod GPU memory and compute limits for unmodified CUDA programs."""
