"""The machine: NVML readings and topology (pynvml imported lazily, here only), psutil fallbacks, visible GPUs, the terminal's width."""
