#!/usr/bin/env python3
"""A checkpoint server that misbehaves on purpose, for t1106 (serve's policy follower).

    policy_http.py DIR      binds 127.0.0.1:0, prints the port on stdout, serves until killed

GET /endless              200 without Content-Length, zeros until the client hangs up
GET /huge-cl              200 with Content-Length 10 GiB, zeros until the client hangs up
GET /trickle              200 with Content-Length 1000000, one byte a second
GET /redirect-other/PATH  302 to http://localhost:PORT/PATH (another origin: 127.0.0.1 vs localhost)
GET /redirect-same/PATH   302 to /PATH (same origin)
GET /PATH                 the file DIR/PATH, or 404
"""
import os
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

ROOT = sys.argv[1]


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def zeros_forever(self):
        block = b"\0" * 65536
        try:
            while True:
                self.wfile.write(block)
        except (BrokenPipeError, ConnectionResetError):
            pass

    def do_GET(self):
        path = self.path
        port = self.server.server_address[1]
        if path == "/endless":
            self.send_response(200)
            self.send_header("Connection", "close")
            self.end_headers()
            self.close_connection = True
            self.zeros_forever()
        elif path == "/huge-cl":
            self.send_response(200)
            self.send_header("Content-Length", str(10 << 30))
            self.end_headers()
            self.close_connection = True
            self.zeros_forever()
        elif path == "/trickle":
            self.send_response(200)
            self.send_header("Content-Length", "1000000")
            self.end_headers()
            self.close_connection = True
            try:
                while True:
                    self.wfile.write(b"\0")
                    self.wfile.flush()
                    time.sleep(1)
            except (BrokenPipeError, ConnectionResetError):
                pass
        elif path.startswith("/redirect-other/"):
            self.send_response(302)
            self.send_header("Location", "http://localhost:%d/%s" % (port, path[len("/redirect-other/"):]))
            self.send_header("Content-Length", "0")
            self.end_headers()
        elif path.startswith("/redirect-same/"):
            self.send_response(302)
            self.send_header("Location", "/" + path[len("/redirect-same/"):])
            self.send_header("Content-Length", "0")
            self.end_headers()
        else:
            full = os.path.join(ROOT, path.lstrip("/"))
            if ".." in path or not os.path.isfile(full):
                self.send_response(404)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            with open(full, "rb") as f:
                data = f.read()
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)


srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
srv.daemon_threads = True
print(srv.server_address[1], flush=True)
srv.serve_forever()
