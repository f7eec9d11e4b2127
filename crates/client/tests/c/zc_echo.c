/* Sends a pattern through ferry's native API with zero-copy buffers to an echo server
 * and checks what comes back. Usage: zc_echo IP PORT BYTES */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/tcp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "ferry.h"

static unsigned char pat(size_t i) { return (unsigned char)(i * 7 + i / 251); }

int main(int argc, char **argv) {
    if (argc != 4) return 2;
    size_t total = strtoul(argv[3], 0, 10);
    ferry_t *h = ferry_open(NULL);
    if (!h) { perror("ferry_open"); return 1; }
    int s = ferry_socket(h, AF_INET, SOCK_STREAM);
    struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons(atoi(argv[2])) };
    inet_pton(AF_INET, argv[1], &sa.sin_addr);
    int r = ferry_connect(h, s, (struct sockaddr *)&sa, sizeof sa);
    if (s < 0 || r < 0) { fprintf(stderr, "socket/connect: %d %d\n", s, r); return 1; }
    int one = 1;
    if (ferry_setsockopt(h, s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one) != 0 ||
        ferry_setsockopt(h, s + 1000, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one) != -EBADF) {
        fprintf(stderr, "setsockopt\n");
        return 1;
    }
    size_t sent = 0, got = 0;
    while (got < total) {
        if (sent < total) {
            size_t cap = 0;
            unsigned char *b = ferry_send_buf(h, &cap);
            if (!b) { fprintf(stderr, "no buffer\n"); return 1; }
            size_t n = total - sent < cap ? total - sent : cap;
            for (size_t i = 0; i < n; i++) b[i] = pat(sent + i);
            if (ferry_send_commit(h, s, b, n) < 0) { fprintf(stderr, "commit\n"); return 1; }
            sent += n;
        }
        const unsigned char *d;
        ssize_t n = ferry_recv_zc(h, s, 1 << 20, (const void **)&d);
        if (n <= 0) { fprintf(stderr, "recv %zd at %zu\n", n, got); return 1; }
        for (ssize_t i = 0; i < n; i++)
            if (d[i] != pat(got + i)) { fprintf(stderr, "mismatch at %zu\n", got + i); return 1; }
        got += n;
        ferry_recv_done(h, d);
    }
    ferry_sock_close(h, s);
    ferry_close(h);
    printf("ok %zu\n", got);
    return 0;
}
