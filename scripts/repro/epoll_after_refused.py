"""A socket stays registered with epoll for EPOLLOUT across a refused non-blocking
connect and a second connect that succeeds, as asyncio's selector keeps it (it issues
no new epoll_ctl). Natively the registration holds and epoll reports EPOLLOUT. From
test_asyncio's test_sock_client_connect_racing, epoll variant (issue 24, item 4).

    python3 epoll_after_refused.py   natively, then
    ferry run -- python3 epoll_after_refused.py
"""
import errno
import select
import socket
import sys
import time

lst = socket.socket()
lst.bind(("127.0.0.1", 0))
addr = lst.getsockname()
s = socket.socket()
s.setblocking(False)
ep = select.epoll()
ep.register(s.fileno(), select.EPOLLOUT)
print("first connect:", errno.errorcode.get(s.connect_ex(addr)))  # refused soon after
time.sleep(0.2)
lst.listen(1)
codes = [errno.errorcode.get(s.connect_ex(addr)) for _ in range(2)]
print("then:", codes)  # ECONNREFUSED (the first one's), EINPROGRESS
ev = ep.poll(2)
try:
    ep.unregister(s.fileno())
    unreg = "ok"
except OSError as e:
    unreg = str(e)
print(f"epoll: {ev}; EPOLL_CTL_DEL: {unreg}", "" if ev else "(WRONG: registration lost)")
sys.exit(0 if ev else 1)
