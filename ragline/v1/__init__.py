"""Generated protobuf and gRPC code for ``proto/ragline/v1`` (by ``proto/gen.py``; do not edit)."""
