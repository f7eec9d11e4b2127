"""Connections whose peer has closed: sending into each must soon fail (EPIPE or
ECONNRESET), in the 100th connection as in the first. Prints, per process, the first
connection whose sends never failed within 0.5 s. From test_asyncio's
test_streams.test_drain_raises, which spins forever in a full run (issue 24, item 2).

    python3 epipe_after_64.py [CONNECTIONS]   natively, then
    ferry run -- python3 epipe_after_64.py [CONNECTIONS]
"""
import socket
import sys
import time

n = int(sys.argv[1]) if len(sys.argv) > 1 else 100
srv = socket.socket()
srv.bind(("127.0.0.1", 0))
srv.listen(8)
never_failed, most = None, 0
for i in range(n):
    c = socket.create_connection(srv.getsockname())
    p, _ = srv.accept()
    p.close()
    time.sleep(0.01)
    ok, t0 = 0, time.monotonic()
    try:
        while time.monotonic() - t0 < 0.5:
            c.send(b"x" * 1024)
            ok += 1
        if never_failed is None:
            never_failed = i
    except OSError:
        pass
    c.close()
    most = max(most, ok)
if never_failed is None:
    print(f"{n} connections: every send into a closed peer failed (at most {most} succeeded)")
else:
    print(f"{n} connections: from connection {never_failed} on, sends into a closed peer "
          f"never fail (up to {most} in 0.5 s) (WRONG)")
sys.exit(0 if never_failed is None else 1)
