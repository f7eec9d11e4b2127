"""The peer reads 1 KiB and closes with data unread (a reset); the sender keeps
sending on a non-blocking socket with SO_SNDBUF 4096, waiting for writability when full.
Natively the sends fail with ECONNRESET/EPIPE after a few KiB. From test_asyncio's
test_sendfile_close_peer_in_the_middle_of_receiving (issue 24, item 3).

    python3 sendfile_peer_closes.py [sendfile|send] [BYTES]   natively, then
    ferry run -- python3 sendfile_peer_closes.py [sendfile|send] [BYTES]
"""
import os
import select
import socket
import sys
import tempfile
import threading
import time

how = sys.argv[1] if len(sys.argv) > 1 else "sendfile"
size = int(sys.argv[2]) if len(sys.argv) > 2 else 256 * 1024 + 1
data = b"x" * size
f = tempfile.TemporaryFile()
f.write(data)
f.flush()
srv = socket.socket()
srv.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
srv.bind(("127.0.0.1", 0))
srv.listen()


def serve():
    c, _ = srv.accept()
    n = 0
    while n < 1024:
        n += len(c.recv(4096))
    c.close()


threading.Thread(target=serve).start()
cli = socket.create_connection(srv.getsockname())
cli.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
cli.setblocking(False)
off, err, t0 = 0, None, time.monotonic()
while off < size and time.monotonic() - t0 < 5:
    try:
        if how == "sendfile":
            off += os.sendfile(cli.fileno(), f.fileno(), off, size - off)
        else:
            off += cli.send(data[off:])
    except BlockingIOError:
        select.select([], [cli], [], 1)
    except OSError as e:
        err = e
        break
print(f"{how}: accepted {off} of {size} bytes, then {err!r}" if err else
      f"{how}: accepted {off} of {size} bytes and no error (WRONG: the peer has reset)")
sys.exit(0 if err else 1)
