"""A scheduler tap for a running ``vllm serve`` (issue 40): ``--scheduler-cls`` loads a subclass
of vLLM's own scheduler that publishes each step's block tables, ref counts, queues and
preemptions over ZeroMQ (frames.py: the wire format, importable without vLLM)."""
