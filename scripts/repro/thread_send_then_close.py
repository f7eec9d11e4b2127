"""A worker thread sends 160 KiB on a non-blocking socket (send() or os.sendfile() in
4 KiB calls, waiting for writability when full) and finishes; the main thread then
closes the socket (close, or shutdown(SHUT_WR or SHUT_RDWR) and close). The peer must
receive every byte the sends reported: natively it always does. From test_os's
TestSendfile (asyncio.to_thread(os.sendfile)) (issue 24, item 1).

    python3 thread_send_then_close.py [send|sendfile] [close|wr|rdwr] [ROUNDS] [main]
    ferry run -- python3 thread_send_then_close.py …
("main": send from the main thread instead: no loss through ferry either.)
"""
import os
import select
import socket
import sys
import tempfile
import threading

args = sys.argv[1:]
how = args[0] if len(args) > 0 else "send"
end = args[1] if len(args) > 1 else "close"
rounds = int(args[2]) if len(args) > 2 else 50
in_main = args[3:] == ["main"]
DATA = b"12345abcde" * 16 * 1024  # 160 KiB, as test_os.TestSendfile
f = tempfile.TemporaryFile()
f.write(DATA)
f.flush()
srv = socket.socket()
srv.bind(("127.0.0.1", 0))
srv.listen()


def receive(out):
    c, _ = srv.accept()
    n = 0
    while d := c.recv(65536):
        n += len(d)
    out.append(n)
    c.close()


def push(cli):
    off = 0
    while off < len(DATA):
        try:
            if how == "sendfile":
                off += os.sendfile(cli.fileno(), f.fileno(), off, 4096)
            else:
                off += cli.send(DATA[off:off + 4096])
        except BlockingIOError:
            select.select([], [cli], [])
    return off


lost = []
for _ in range(rounds):
    got = []
    t = threading.Thread(target=receive, args=(got,))
    t.start()
    cli = socket.create_connection(srv.getsockname())
    cli.setblocking(False)
    if in_main:
        sent = push(cli)
    else:
        res = []
        w = threading.Thread(target=lambda: res.append(push(cli)))
        w.start()
        w.join()
        sent = res[0]
    if end != "close":
        cli.shutdown(socket.SHUT_WR if end == "wr" else socket.SHUT_RDWR)
    cli.close()
    t.join()
    if got[0] != sent:
        lost.append(sent - got[0])
print(f"{how} from {'the main thread' if in_main else 'a worker thread'}, then {end}: "
      f"{len(lost)} of {rounds} rounds lost bytes {lost[:5]}", "(WRONG)" if lost else "")
sys.exit(1 if lost else 0)
