"""Regenerate ``et_def_pb2.py`` from ``et_def.proto`` (needs ``grpcio-tools``, which is not a dependency).

    pip install grpcio-tools && python src/mcdla/workload/et_def/generate.py

It runs protoc, then registers the schema in a private descriptor pool instead of protobuf's default one, so
that mcdla's copy never clashes with another copy of Chakra's schema (Chakra's own ``et_def_pb2``) imported
into the same process; the messages are the same on the wire. ``tests/workload/test_chakra_schema.py`` checks
that the committed module equals what this produces (when grpcio-tools is installed) and that its messages
match the ``.proto`` field by field (always).
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

__all__ = ["HERE", "generate_text", "main"]

HERE = Path(__file__).resolve().parent

_HEADER = (
    "# Generated from et_def.proto (Chakra's execution-trace schema, MIT; see the .proto's header) by\n"
    "# `python src/mcdla/workload/et_def/generate.py` (grpcio-tools' protoc), with the schema registered in a private\n"
    "# descriptor pool. Do not edit; regenerate.\n"
)
_DEFAULT_POOL = "DESCRIPTOR = _descriptor_pool.Default().AddSerializedFile("
_PRIVATE_POOL = "POOL = _descriptor_pool.DescriptorPool()\nDESCRIPTOR = POOL.AddSerializedFile("


def generate_text(proto: Path = HERE / "et_def.proto") -> str:
    """The text of ``et_def_pb2.py`` generated from ``proto``."""
    from grpc_tools import protoc  # optional: only to regenerate

    with tempfile.TemporaryDirectory() as out:
        code = protoc.main(["protoc", f"-I{proto.parent}", f"--python_out={out}", str(proto)])
        if code != 0:
            raise RuntimeError(f"protoc failed on {proto} (exit status {code})")
        text = (Path(out) / "et_def_pb2.py").read_text()
    if text.count(_DEFAULT_POOL) != 1:
        raise RuntimeError("protoc's output changed shape: no single default-pool registration to replace")
    return _HEADER + text.replace(_DEFAULT_POOL, _PRIVATE_POOL)


def main() -> None:
    target = HERE / "et_def_pb2.py"
    target.write_text(generate_text())
    print(f"wrote {target}", file=sys.stderr)


if __name__ == "__main__":
    main()
