"""What NCCL logs, profiler traces and nsys tables say, and the advice drawn from them. Pure: lines and dicts in, data out."""
