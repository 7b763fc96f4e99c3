"""Generated protobuf and gRPC stubs of the optstep v1 API (see setup.py)."""
