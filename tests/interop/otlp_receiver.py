"""An OTLP trace receiver for the tests: HTTP/protobuf (POST /v1/traces) and gRPC
(opentelemetry.proto.collector.trace.v1.TraceService/Export), decoding each export with the
OpenTelemetry protocol's own messages and appending one JSON line per span to --out.

    python otlp_receiver.py --http-port 0 --grpc-port 0 --ready-file F --out spans.jsonl

--ready-file gets "HTTP_PORT GRPC_PORT" once both listen. --status N makes the HTTP side
answer every export with status N (a collector that refuses), --delay S makes it wait S
seconds first (a slow one).
"""

import argparse
import json
import threading
import time
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

LOCK = threading.Lock()


def value_of(v):
    kind = v.WhichOneof('value')
    if kind == 'array_value':
        return [value_of(x) for x in v.array_value.values]
    if kind == 'kvlist_value':
        return {kv.key: value_of(kv.value) for kv in v.kvlist_value.values}
    if kind == 'bytes_value':
        return v.bytes_value.hex()
    return getattr(v, kind) if kind else None


def attrs(kvs):
    return {kv.key: value_of(kv.value) for kv in kvs}


def write_spans(out, request, protocol):
    lines = []
    for rs in request.resource_spans:
        resource = attrs(rs.resource.attributes)
        for ss in rs.scope_spans:
            for s in ss.spans:
                lines.append(json.dumps({
                    'protocol': protocol,
                    'resource': resource,
                    'scope': ss.scope.name,
                    'trace_id': s.trace_id.hex(),
                    'span_id': s.span_id.hex(),
                    'parent_span_id': s.parent_span_id.hex(),
                    'name': s.name,
                    'kind': s.kind,
                    'start': s.start_time_unix_nano,
                    'end': s.end_time_unix_nano,
                    'attributes': attrs(s.attributes),
                    'links': [{'trace_id': l.trace_id.hex(), 'span_id': l.span_id.hex()}
                              for l in s.links],
                    'status': {'code': s.status.code, 'message': s.status.message},
                }))
    with LOCK, open(out, 'a') as f:
        for line in lines:
            f.write(line + '\n')


class Traces(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self, out):
        self.out = out

    def Export(self, request, context):
        write_spans(self.out, request, 'grpc')
        return trace_service_pb2.ExportTraceServiceResponse()


def main():
    p = argparse.ArgumentParser()
    p.add_argument('--http-port', type=int, default=0)
    p.add_argument('--grpc-port', type=int, default=0)
    p.add_argument('--out', required=True)
    p.add_argument('--ready-file', required=True)
    p.add_argument('--status', type=int, default=200)
    p.add_argument('--delay', type=float, default=0.0)
    args = p.parse_args()

    class Http(BaseHTTPRequestHandler):
        def do_POST(self):
            body = self.rfile.read(int(self.headers.get('content-length', 0)))
            if args.delay:
                time.sleep(args.delay)
            if self.path != '/v1/traces':
                self.send_response(404)
                self.end_headers()
                return
            if args.status == 200:
                request = trace_service_pb2.ExportTraceServiceRequest()
                request.ParseFromString(body)
                write_spans(args.out, request, 'http/protobuf')
            answer = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
            self.send_response(args.status)
            self.send_header('content-type', 'application/x-protobuf')
            self.send_header('content-length', str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, *a):
            pass

    http = ThreadingHTTPServer(('127.0.0.1', args.http_port), Http)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Traces(args.out), server)
    grpc_port = server.add_insecure_port(f'127.0.0.1:{args.grpc_port}')
    server.start()
    with open(args.ready_file + '.tmp', 'w') as f:
        f.write(f'{http.server_address[1]} {grpc_port}')
    import os
    os.replace(args.ready_file + '.tmp', args.ready_file)
    http.serve_forever()


if __name__ == '__main__':
    main()
