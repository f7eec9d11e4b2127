/* ferry's native API: talk to a ferry protocol server over shared memory without the
 * LD_PRELOAD shim, filling and reading the channel's buffers directly (no copy beyond
 * the kernel's own). Link with -lferry_client (libferry_client.so).
 *
 * One handle is one channel: use it from one thread at a time. Functions return a
 * negated errno on failure. Inside `ferry run`, ferry_open(NULL) finds the server
 * through $FERRY_SOCKET.
 */
#ifndef FERRY_H
#define FERRY_H

#include <stddef.h>
#include <sys/types.h>
#include <sys/socket.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct FerryHandle ferry_t;

/* Opens a channel; NULL (errno set) on failure. path NULL: $FERRY_SOCKET. */
ferry_t *ferry_open(const char *path);
/* Closes the channel and every socket it holds. */
void ferry_close(ferry_t *h);

/* Creates a socket (AF_INET/AF_INET6, SOCK_STREAM/SOCK_DGRAM); returns its id >= 0. */
int ferry_socket(ferry_t *h, int domain, int type);
/* Connects (blocking). */
int ferry_connect(ferry_t *h, int sock, const struct sockaddr *addr, socklen_t len);
/* Closes a socket. */
int ferry_sock_close(ferry_t *h, int sock);
/* shutdown(2) of a socket; SHUT_WR ends a bound module's input. */
int ferry_shutdown(ferry_t *h, int sock, int how);
/* setsockopt(2) of a socket (val at most 32 bytes), e.g. TCP_NODELAY. */
int ferry_setsockopt(ferry_t *h, int sock, int level, int name, const void *val, socklen_t len);

/* Binds a data-path module (WebAssembly, binary or .wat text) to a connected stream
 * socket: the protocol server runs it next to the socket. props: nprops strings
 * "key=value"; fds: nfds regular files the module may send (file 0, 1, ...; the
 * caller keeps its descriptors). Afterwards what is sent on the socket is the
 * module's input and what it emits goes to the peer. Returns 0, -EINVAL (bad module,
 * property or file), -EBUSY (already bound), -ENOBUFS (server at its module limit),
 * -EIO (the module failed at start; the connection was reset). */
int ferry_bind_module(ferry_t *h, int sock, const void *module, size_t module_len,
                      const char *const *props, size_t nprops, const int *fds, size_t nfds);

/* Registers a file (regular, open for reading) with the channel's server, once: returns
 * a handle >= 0 that bindings name instead of passing the descriptor again (the server
 * keeps its own reference; the caller may close fd). -EINVAL (not a regular file),
 * -EBADF (not readable), -ENFILE (the channel has 1024 registered). The registration
 * ends with ferry_unregister_file or ferry_close. */
int ferry_register_file(ferry_t *h, int fd);
/* Forgets a registered file; bindings made before still send it. 0 or -EBADF. */
int ferry_unregister_file(ferry_t *h, int handle);

/* Do not wait for the answer of a binding once its module is loaded (an error comes
 * back on a later call on the socket). */
#define FERRY_BIND_NOWAIT 1
/* ferry_bind_module whose module may also send registered files: its files are fds[0..
 * nfds), then handles[0..nhandles) (from ferry_register_file; an unknown handle:
 * -EBADF). flags: 0 or FERRY_BIND_NOWAIT. */
int ferry_bind_module_ex(ferry_t *h, int sock, const void *module, size_t module_len,
                         const char *const *props, size_t nprops, const int *fds,
                         size_t nfds, const int *handles, size_t nhandles, int flags);

/* Zero-copy send: get a free channel buffer (*cap bytes), fill it, commit len bytes of
 * it. The server sends straight from the buffer. Returns NULL when none can be had. */
void *ferry_send_buf(ferry_t *h, size_t *cap);
int ferry_send_commit(ferry_t *h, int sock, void *buf, size_t len);

/* Zero-copy receive: *data points into the server's receive buffer (up to max bytes,
 * at most one buffer) until ferry_recv_done. Returns the length, 0 at end of stream. */
ssize_t ferry_recv_zc(ferry_t *h, int sock, size_t max, const void **data);
int ferry_recv_done(ferry_t *h, const void *data);

#ifdef __cplusplus
}
#endif

#endif /* FERRY_H */
