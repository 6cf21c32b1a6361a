"""moto's server (the DynamoDB and KMS wire protocol on loopback) with requests serialized.

DynamoDB applies a conditional write atomically per item. moto's threaded server does not lock
around its condition check and update, so two concurrent claims of one free machine number can
both succeed: the lease-store conformance race test (8 claimants, exactly one winner) catches
exactly that against stock `moto_server`. One lock around the WSGI application makes every
request atomic, which is the contract our lease store relies on; connections stay threaded.

Usage: python moto_server.py --host 127.0.0.1 --port 5055
"""

import argparse
import os
import signal
import sys
import threading

from werkzeug.serving import run_simple

from moto.moto_server.werkzeug_app import (
    DomainDispatcherApplication,
    MotoRequestHandler,
    create_backend_app,
)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    os.environ.setdefault("MOTO_PORT", str(args.port))

    app = DomainDispatcherApplication(create_backend_app)
    lock = threading.Lock()

    def serialized(environ, start_response):
        with lock:
            # Materialize the body inside the lock: the backend work happens while it is built.
            return list(app(environ, start_response))

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    run_simple(args.host, args.port, serialized, threaded=True, request_handler=MotoRequestHandler)


if __name__ == "__main__":
    main()
