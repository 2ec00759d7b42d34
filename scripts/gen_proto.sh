#!/usr/bin/env bash
# Regenerate proto/rlsched_agent_pb2.py and proto/rlsched_agent_pb2_grpc.py
# from proto/rlsched_agent.proto with grpc_tools.protoc.
#
# The generated gRPC module imports "rlsched_agent_pb2" as a top-level module;
# we rewrite that to a package-relative import so that `import proto.rlsched_agent_pb2_grpc`
# works without putting proto/ on sys.path.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/python-env.sh   # PY: ${PYTHON:-python3}, or .venv on an externally managed Python
"$PY" -m grpc_tools.protoc -I proto \
    --python_out=proto --pyi_out=proto --grpc_python_out=proto \
    proto/rlsched_agent.proto
sed -i 's/^import rlsched_agent_pb2 as /from . import rlsched_agent_pb2 as /' proto/rlsched_agent_pb2_grpc.py
echo "generated: proto/rlsched_agent_pb2.py proto/rlsched_agent_pb2.pyi proto/rlsched_agent_pb2_grpc.py"
