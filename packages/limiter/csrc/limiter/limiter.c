/* libcuda_limiter.so: placeholder until the interception core lands. */
