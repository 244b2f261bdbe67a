"""An OTLP/HTTP collector that answers every export 200 and keeps nothing: where the
benchmarks' spans go (scripts/bench.sh otel, scripts/callgrind.sh echo_otel).

    python3 scripts/bench/otlp_sink.py PORT
"""
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Sink(BaseHTTPRequestHandler):
    def do_POST(self):
        self.rfile.read(int(self.headers.get("content-length", 0)))
        self.send_response(200)
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Sink).serve_forever()
