"""ONNX: export through funasr, the recipe's one ONNX inference path, parity with PyTorch, the benchmark."""
