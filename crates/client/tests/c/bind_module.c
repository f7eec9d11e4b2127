/* Binds a data-path module through ferry's C API: connects to IP PORT, binds the module
 * in MODULE_FILE (http_file) with the body FILE, and closes its socket. A module that
 * must fail (LOOP_FILE) is bound on a second connection first: it must answer -EIO.
 * Then, on a third connection, FILE registered once and bound by handle
 * (ferry_bind_module_ex), with the errors of unknown and unregistered handles.
 * Usage: bind_module IP PORT MODULE_FILE FILE LOOP_FILE */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "ferry.h"

static char *slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc(n > 0 ? n : 1);
    if (fread(b, 1, n, f) != (size_t)n) { fclose(f); free(b); return NULL; }
    fclose(f);
    *len = n;
    return b;
}

static int dial(ferry_t *h, const char *ip, const char *port) {
    int s = ferry_socket(h, AF_INET, SOCK_STREAM);
    struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons(atoi(port)) };
    inet_pton(AF_INET, ip, &sa.sin_addr);
    if (s < 0 || ferry_connect(h, s, (struct sockaddr *)&sa, sizeof sa) < 0) return -1;
    return s;
}

int main(int argc, char **argv) {
    if (argc != 6) return 2;
    size_t mlen, llen;
    char *module = slurp(argv[3], &mlen), *loop = slurp(argv[5], &llen);
    if (!module || !loop) { perror("module"); return 1; }
    ferry_t *h = ferry_open(NULL);
    if (!h) { perror("ferry_open"); return 1; }

    int bad = dial(h, argv[1], argv[2]);
    if (bad < 0) { fprintf(stderr, "dial 1\n"); return 1; }
    int r = ferry_bind_module(h, bad, loop, llen, NULL, 0, NULL, 0);
    if (r != -EIO) { fprintf(stderr, "looping module: %d, want -EIO\n", r); return 1; }
    ferry_sock_close(h, bad);

    int s = dial(h, argv[1], argv[2]);
    if (s < 0) { fprintf(stderr, "dial 2\n"); return 1; }
    int fd = open(argv[4], O_RDONLY);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) < 0) { perror(argv[4]); return 1; }
    char len[32], prop[64];
    snprintf(len, sizeof len, "%lld", (long long)st.st_size);
    snprintf(prop, sizeof prop, "content-length=%s", len);
    const char *props[] = { prop, "content-type=text/x-c-test" };
    const char *bad_props[] = { "no-equals-sign" };
    if (ferry_bind_module(h, s, module, mlen, bad_props, 1, &fd, 1) != -EINVAL) {
        fprintf(stderr, "property without '=' accepted\n");
        return 1;
    }
    r = ferry_bind_module(h, s, module, mlen, props, 2, &fd, 1);
    if (r != 0) { fprintf(stderr, "bind: %d\n", r); return 1; }
    ferry_sock_close(h, s);

    /* Registered once, bound by handle. */
    int reg = ferry_register_file(h, fd);
    close(fd);
    if (reg < 0) { fprintf(stderr, "register: %d\n", reg); return 1; }
    if (ferry_register_file(h, -1) != -EBADF) { fprintf(stderr, "register -1\n"); return 1; }
    int t = dial(h, argv[1], argv[2]);
    if (t < 0) { fprintf(stderr, "dial 3\n"); return 1; }
    int unknown = reg + 100;
    r = ferry_bind_module_ex(h, t, module, mlen, props, 2, NULL, 0, &unknown, 1, 0);
    if (r != -EBADF) { fprintf(stderr, "unknown handle: %d, want -EBADF\n", r); return 1; }
    r = ferry_bind_module_ex(h, t, module, mlen, props, 2, NULL, 0, &reg, 1, 42);
    if (r != -EINVAL) { fprintf(stderr, "bad flags: %d, want -EINVAL\n", r); return 1; }
    r = ferry_bind_module_ex(h, t, module, mlen, props, 2, NULL, 0, &reg, 1, FERRY_BIND_NOWAIT);
    if (r != 0) { fprintf(stderr, "bind by handle: %d\n", r); return 1; }
    if ((r = ferry_unregister_file(h, reg)) != 0) { fprintf(stderr, "unregister: %d\n", r); return 1; }
    if ((r = ferry_unregister_file(h, reg)) != -EBADF) {
        fprintf(stderr, "unregister twice: %d, want -EBADF\n", r);
        return 1;
    }
    r = ferry_bind_module_ex(h, t, module, mlen, props, 2, NULL, 0, &reg, 1, 0);
    if (r != -EBADF) { fprintf(stderr, "unregistered handle: %d, want -EBADF\n", r); return 1; }
    ferry_sock_close(h, t);
    ferry_close(h);
    printf("ok\n");
    return 0;
}
