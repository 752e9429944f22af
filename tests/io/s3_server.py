#!/usr/bin/env python3
"""A real S3-compatible server for the storage tests, on 127.0.0.1 only:
moto's server, with signature checking on, behind a proxy that injects
faults. Both listen on free ports inside this one process, so a test starts
them with one command and they die with it.

When ready, prints one JSON line to stdout:
  {"endpoint": "http://127.0.0.1:P",   moto itself
   "proxy": "http://127.0.0.1:Q",      the fault-injecting proxy in front of it
   "access_key": ..., "secret_key": ..., "bucket": ...}
or a line starting "skip:" when moto is not installed. Then answers one line
per command read from stdin, and exits when stdin closes:
  faults F1 F2 ...   the next requests through the proxy meet these, in order
  always F           every request meets F (until clear)
  random P SEED      each request meets a random fault with probability P
  clear              no more faults
  count              {"requests": n, "faults": m} seen by the proxy so far
Faults: ok | 500 | 503 | slowdown | 429 | drop (connection closed before the
request reaches the server) | stall (no reply for --stall-s seconds, then
closed) | lost (the server applies the request, the reply is dropped).

Usage: s3_server.py [--stall-s 3]
"""
import argparse
import http.client
import json
import logging
import random
import socket
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

try:
    import boto3
    from moto import settings as moto_settings
    from moto.core.authorization import ActionAuthenticatorMixin
    from moto.core.responses import BaseResponse
    from moto.server import ThreadedMotoServer
except ImportError as e:  # say so; the test decides whether that is fatal
    print(f"skip: moto[server] is not installed ({e}); pip install 'moto[server]'", flush=True)
    sys.exit(0)

BUCKET = "lathe-test"
ERRORS = {
    "500": (500, "InternalError", "We encountered an internal error. Please try again."),
    "503": (503, "ServiceUnavailable", "Service is unable to handle request."),
    "slowdown": (503, "SlowDown", "Please reduce your request rate."),
    "429": (429, "TooManyRequests", "Too many requests."),
}
RANDOM_FAULTS = ["500", "503", "slowdown", "429", "drop", "lost"]
HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "server", "date"}


class Faults:
    """What the next request through the proxy meets; shared by its threads."""

    def __init__(self):
        self.lock = threading.Lock()
        self.queue, self.always, self.rng, self.p = [], None, None, 0.0
        self.requests = self.injected = 0

    def command(self, words):
        with self.lock:
            if words[0] == "faults":
                self.queue = list(words[1:])
            elif words[0] == "always":
                self.always = words[1]
            elif words[0] == "random":
                self.p, self.rng = float(words[1]), random.Random(int(words[2]))
            elif words[0] == "clear":
                self.queue, self.always, self.rng = [], None, None
            elif words[0] == "count":
                return json.dumps({"requests": self.requests, "faults": self.injected})
            else:
                return f"error: unknown command {words[0]}"
        return "ok"

    def next(self):
        with self.lock:
            self.requests += 1
            fault = "ok"
            if self.queue:
                fault = self.queue.pop(0)
            elif self.always:
                fault = self.always
            elif self.rng and self.rng.random() < self.p:
                fault = self.rng.choice(RANDOM_FAULTS)
            if fault != "ok":
                self.injected += 1
            return fault


def check_signatures_on_the_request_as_sent():
    """moto recomputes a request's signature from its decoded URL, so a key or
    a query value holding a character that must be percent-encoded ('=' in
    "step=000010", '/' in a listing prefix) never verifies. AWS checks the
    path and query exactly as the client sent them; make moto do the same."""
    setup = BaseResponse.setup_class
    check = ActionAuthenticatorMixin._authenticate_and_authorize_action

    def setup_keeping_raw_uri(self, request, full_url, headers, *args, **kwargs):
        setup(self, request, full_url, headers, *args, **kwargs)
        environ = getattr(request, "environ", None) or {}
        self.raw_request_uri = environ.get("RAW_URI") or environ.get("REQUEST_URI")

    def check_as_sent(self, iam_request_cls, resource="*"):
        raw = getattr(self, "raw_request_uri", None)
        if not raw:
            return check(self, iam_request_cls, resource)
        decoded, self.uri = self.uri, raw
        try:
            return check(self, iam_request_cls, resource)
        finally:
            self.uri = decoded

    BaseResponse.setup_class = setup_keeping_raw_uri
    ActionAuthenticatorMixin._authenticate_and_authorize_action = check_as_sent


def make_proxy(upstream_port, faults, stall_s):
    class Proxy(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def handle_any(self):
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            fault = faults.next()
            if fault == "drop":
                return self.hang_up()
            if fault == "stall":
                threading.Event().wait(stall_s)
                return self.hang_up()
            if fault in ERRORS:
                status, code, message = ERRORS[fault]
                xml = (f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code>'
                       f"<Message>{message}</Message><RequestId>injected</RequestId></Error>").encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/xml")
                self.send_header("Content-Length", str(len(xml)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(xml)
                return
            conn = http.client.HTTPConnection("127.0.0.1", upstream_port, timeout=60)
            conn.request(self.command, self.path, body=body, headers=dict(self.headers.items()))
            resp = conn.getresponse()
            data = resp.read()
            conn.close()
            if fault == "lost":
                return self.hang_up()
            self.send_response(resp.status)
            for k, v in resp.getheaders():
                if k.lower() not in HOP_BY_HOP:
                    self.send_header(k, v)
            self.send_header("Content-Length", resp.getheader("Content-Length") or str(len(data)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)

        def hang_up(self):
            self.close_connection = True
            try:
                self.connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

        do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = handle_any

    return Proxy


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--stall-s", type=float, default=3.0)
    args = ap.parse_args()
    logging.getLogger("werkzeug").setLevel(logging.ERROR)

    moto = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    moto.start()
    port = moto.get_host_and_port()[1]
    endpoint = f"http://127.0.0.1:{port}"

    # Set up a user, its key and the bucket while moto still lets anyone in,
    # then turn signature checking on: from here a request signed wrongly, or
    # with an unknown key, is refused the way AWS refuses it.
    admin = dict(endpoint_url=endpoint, region_name="us-east-1",
                 aws_access_key_id="setup", aws_secret_access_key="setup")
    iam = boto3.client("iam", **admin)
    iam.create_user(UserName="lathe")
    iam.put_user_policy(UserName="lathe", PolicyName="s3", PolicyDocument=json.dumps({
        "Version": "2012-10-17",
        "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}]}))
    key = iam.create_access_key(UserName="lathe")["AccessKey"]
    boto3.client("s3", **admin).create_bucket(Bucket=BUCKET)
    check_signatures_on_the_request_as_sent()
    moto_settings.INITIAL_NO_AUTH_ACTION_COUNT = 0

    faults = Faults()
    proxy = ThreadingHTTPServer(("127.0.0.1", 0), make_proxy(port, faults, args.stall_s))
    proxy.daemon_threads = True
    threading.Thread(target=proxy.serve_forever, daemon=True).start()

    print(json.dumps({"endpoint": endpoint, "proxy": f"http://127.0.0.1:{proxy.server_address[1]}",
                      "access_key": key["AccessKeyId"], "secret_key": key["SecretAccessKey"],
                      "bucket": BUCKET}), flush=True)
    for line in sys.stdin:
        words = line.split()
        if words:
            print(faults.command(words), flush=True)


if __name__ == "__main__":
    main()
