"""ONNX front-end: BN layers of a ModelProto, and the inference / folding rewrites."""
