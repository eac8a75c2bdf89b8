#!/usr/bin/env python3
"""Talks to a running colibrid with stock Python gRPC (grpcio), nothing from this repository
but the .proto file: health check, server reflection, Status, and a streamed Generate.

It shows that any gRPC client can use the daemon. CI runs it through tools/grpc_smoke.sh; the
same checks run in Rust in tests/tests/daemon_reflection.rs with a reflection-driven
generic client.

Usage:
    python3 -m venv /tmp/grpc-venv
    /tmp/grpc-venv/bin/pip install grpcio grpcio-tools grpcio-reflection grpcio-health-checking
    colibrid --socket /tmp/c.sock --state-dir /tmp/c-state &
    /tmp/grpc-venv/bin/python tools/grpc_smoke.py --socket /tmp/c.sock --model tests/fixtures/olmoe

Exits 0 when every check passed.
"""

import argparse
import json
import os
import sys
import tempfile

import grpc
from grpc_tools import protoc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def compile_proto(out_dir):
    """Generates colibri_pb2 / colibri_pb2_grpc from proto/colibri/v1/colibri.proto."""
    proto_root = os.path.join(ROOT, "proto")
    rc = protoc.main([
        "grpc_tools.protoc",
        f"-I{proto_root}",
        f"--python_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        os.path.join(proto_root, "colibri", "v1", "colibri.proto"),
    ])
    if rc != 0:
        sys.exit(f"protoc failed ({rc})")
    sys.path.insert(0, out_dir)
    from colibri.v1 import colibri_pb2, colibri_pb2_grpc  # noqa: E402
    return colibri_pb2, colibri_pb2_grpc


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--socket", required=True)
    ap.add_argument("--model", required=True, help="model directory (e.g. tests/fixtures/olmoe)")
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--authority", help="set grpc.default_authority (default: grpcio's own "
                    "choice, which is the %%-encoded socket path)")
    args = ap.parse_args()

    with tempfile.TemporaryDirectory() as gen:
        pb, pb_grpc = compile_proto(gen)
        # With default options gRPC C-core sends the %-encoded socket path as the HTTP/2
        # :authority, which h2 refuses as an authority; colibrid repairs it (daemon/src/
        # authority.rs), so a stock channel works. --authority checks the explicit form too.
        options = [("grpc.default_authority", args.authority)] if args.authority else []
        channel = grpc.insecure_channel(f"unix:{os.path.abspath(args.socket)}", options=options)
        print("channel options:", options or "grpcio defaults")

        health = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=""))
        assert health.status == health_pb2.HealthCheckResponse.SERVING, health
        print("health: SERVING")

        refl = reflection_pb2_grpc.ServerReflectionStub(channel)
        answers = refl.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")]))
        services = [s.name for a in answers for s in a.list_services_response.service]
        assert "colibri.v1.Colibri" in services, services
        print("reflection:", ", ".join(sorted(services)))

        stub = pb_grpc.ColibriStub(channel)
        for progress in stub.LoadModel(pb.LoadModelRequest(model=os.path.abspath(args.model))):
            last = progress
        assert last.stage == pb.LoadModelProgress.STAGE_READY, last
        model_id = last.info.id

        status = stub.Status(pb.StatusRequest())
        print(f"status: version {status.version}, pid {status.pid}, "
              f"{len(status.models)} model(s), uptime {status.uptime_seconds:.1f} s")
        assert status.version and status.models

        ref_path = os.path.join(os.path.abspath(args.model), "ref.json")
        prompt = json.load(open(ref_path))["prompt_ids"] if os.path.exists(ref_path) else [1, 2, 3]
        req = pb.GenerateRequest(
            model=model_id,
            prompt_ids=prompt,
            options=pb.GenerationOptions(max_tokens=args.max_tokens, ignore_eos=True,
                                         sampling=pb.SamplingParams(temperature=0.0)),
        )
        ids, finished = [], None
        for ev in stub.Generate(req):
            kind = ev.WhichOneof("event")
            if kind == "tokens":
                ids.extend(ev.tokens.ids)
            elif kind == "finished":
                finished = ev.finished
        assert finished is not None and len(ids) == args.max_tokens, (ids, finished)
        if os.path.exists(ref_path):
            want = json.load(open(ref_path))["greedy_ids"][: args.max_tokens]
            assert ids == want, (ids, want)
        print(f"generate: {ids} ({pb.FinishReason.Name(finished.reason)}, "
              f"{finished.stats.decode_tokens_per_second:.1f} tok/s)")

        try:
            stub.Generate(pb.GenerateRequest(model=model_id, prompt_ids=[10**6],
                                             options=pb.GenerationOptions(max_tokens=1))).next()
            sys.exit("an out-of-vocabulary id was accepted")
        except grpc.RpcError as e:
            assert e.code() == grpc.StatusCode.INVALID_ARGUMENT, e
            print("invalid id:", e.code().name, "-", e.details())
        # Several calls on one connection: the repaired authority also reaches h2 through
        # HPACK's dynamic table (indexed) on later requests.
        for _ in range(3):
            assert stub.Status(pb.StatusRequest()).version
        print("repeated calls on one channel: ok")
    print("grpc_smoke: all checks passed")


if __name__ == "__main__":
    main()
