"""Runs test_asyncio cases after N connections in the same process whose sends failed
with a broken pipe (as earlier cases leave behind in a full test_asyncio run), to show
which cases depend on issue 24's item 2 (epipe_after_64.py). Needs Debian's
libpython3.11-testsuite. Natively the cases pass after any N; through ferry
test_drain_raises hangs after 80 (use `timeout`), the fallback cases fail.

    timeout 60 python3 after_broken_pipes.py N MODULE PATTERN
    timeout 60 ferry run -- python3 after_broken_pipes.py 80 test_streams test_drain_raises
    ferry run -- python3 after_broken_pipes.py 80 test_sendfile fallback_close_peer
"""
import importlib
import socket
import sys
import time
import unittest

n, module, pattern = int(sys.argv[1]), sys.argv[2], sys.argv[3]
srv = socket.socket()
srv.bind(("127.0.0.1", 0))
srv.listen(8)
for _ in range(n):
    c = socket.create_connection(srv.getsockname())
    p, _ = srv.accept()
    p.close()
    time.sleep(0.01)
    try:
        for _ in range(1000):
            c.send(b"x" * 1024)
    except OSError:
        pass
    c.close()
mod = importlib.import_module(f"test.test_asyncio.{module}")
result = unittest.main(module=mod, argv=["after_broken_pipes", "-k", pattern], exit=False)
sys.exit(0 if result.result.wasSuccessful() else 1)
