#!/usr/bin/env python
"""Regenerate minicaffe/proto/caffe_descriptor.bin from minicaffe/proto/caffe.proto.

minicaffe ships the compiled schema as a serialized FileDescriptorSet instead of protoc's generated
caffe_pb2.py: generated modules pin the protobuf runtime version they accept, and the GPU machine's
protobuf is older than the one that would generate them. A descriptor set is plain protobuf data
that every runtime >= 4 can load (see minicaffe/proto/caffe_pb2.py).

Needs grpcio-tools (it bundles protoc as a Python module). Usage:

    python scripts/gen_proto.py          # rewrite the .bin
    python scripts/gen_proto.py --check  # exit 1 if the .bin is out of date
"""

import argparse
import os
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROTO_DIR = os.path.join(REPO, "minicaffe", "proto")
PROTO_NAME = "caffe.proto"
DESCRIPTOR_PATH = os.path.join(PROTO_DIR, "caffe_descriptor.bin")


def generate_descriptor_set(proto_dir=PROTO_DIR, proto_name=PROTO_NAME):
    """Compile `proto_dir/proto_name` with grpc_tools' protoc; return the FileDescriptorSet bytes.

    Source info (comments, spans) is left out: the runtime does not need it and it would make the
    file change with every comment edit.
    """
    from grpc_tools import protoc  # imported here so that --help works without grpcio-tools

    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "caffe_descriptor.bin")
        rc = protoc.main([
            "protoc",
            f"--proto_path={proto_dir}",
            f"--descriptor_set_out={out}",
            "--include_imports",
            os.path.join(proto_dir, proto_name),
        ])
        if rc != 0:
            source = os.path.join(proto_dir, proto_name)
            raise RuntimeError(f"protoc failed on {source} (exit {rc})")
        with open(out, "rb") as f:
            return f.read()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="do not write; exit 1 if the checked-in descriptor is stale")
    args = parser.parse_args(argv)

    fresh = generate_descriptor_set()
    try:
        with open(DESCRIPTOR_PATH, "rb") as f:
            current = f.read()
    except FileNotFoundError:
        current = None
    if args.check:
        if fresh != current:
            print(f"{DESCRIPTOR_PATH} is out of date: run python scripts/gen_proto.py",
                  file=sys.stderr)
            return 1
        print(f"{DESCRIPTOR_PATH} is up to date")
        return 0
    if fresh == current:
        print(f"{DESCRIPTOR_PATH} already up to date")
        return 0
    tmp = DESCRIPTOR_PATH + ".tmp"
    with open(tmp, "wb") as f:
        f.write(fresh)
    os.replace(tmp, DESCRIPTOR_PATH)
    print(f"wrote {DESCRIPTOR_PATH} ({len(fresh)} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
