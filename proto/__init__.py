"""Generated gRPC code for the node agent API (``rlsched_agent.proto``).

Regenerate with ``scripts/gen_proto.sh``; import as ``from proto import rlsched_agent_pb2, rlsched_agent_pb2_grpc``.
"""
