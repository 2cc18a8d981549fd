"""The HTTP service of an exported model: FastAPI app, dynamic batcher, long-audio splitting, metrics."""
