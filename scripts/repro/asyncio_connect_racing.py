"""test_asyncio's test_sock_client_connect_racing, reduced: a non-blocking connect to a
port bound but not listening is started and cancelled at once, the port then listens
and the socket connects again (issue 24, item 4; epoll_after_refused.py is the same
without asyncio).

    python3 asyncio_connect_racing.py [epoll|poll]   natively, then
    ferry run -- python3 asyncio_connect_racing.py [epoll|poll]
"""
import asyncio
import selectors
import socket
import sys


async def racing(loop, listener, sock):
    listener.bind(("127.0.0.1", 0))
    addr = listener.getsockname()
    sock.setblocking(False)
    task = asyncio.create_task(loop.sock_connect(sock, addr))
    await asyncio.sleep(0)
    task.cancel()
    listener.listen(1)
    for i in range(128):
        try:
            await loop.sock_connect(sock, addr)
        except ConnectionRefusedError:
            continue
        return f"connected after {i} refusals"
    return "refused 128 times"


poll = sys.argv[1:] == ["poll"]
loop = asyncio.SelectorEventLoop(selectors.PollSelector() if poll else selectors.EpollSelector())
with socket.socket() as listener, socket.socket() as sock:
    try:
        print(loop.run_until_complete(asyncio.wait_for(racing(loop, listener, sock), 5)))
    except asyncio.TimeoutError:
        print("TimeoutError: the second connect never completed (WRONG)")
        sys.exit(1)
