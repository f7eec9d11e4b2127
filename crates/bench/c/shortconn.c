/* ferry-shortconn: short connections, one after another (R2 of `ferry bench`).
 *
 *   ferry-shortconn server IP PORT
 *       accepts, reads the 1-byte request, answers 1 byte, closes; forever.
 *   ferry-shortconn client IP PORT SECONDS
 *       connect, send 1 byte, read the 1-byte reply, read the end of the stream,
 *       close, in a loop for SECONDS; prints `connections N seconds S`, then the
 *       mean time of each phase of a connection in microseconds (`phases-us socket A
 *       connect B exchange C end D close E`: exchange is the write and the reply's
 *       read, end the read of the end of stream). Exits 1 on the first failure.
 *   ferry-shortconn client IP PORT SECONDS PAUSE_US
 *       the same, sleeping PAUSE_US microseconds after each connection (not part of
 *       any phase): sporadic connections, each made after the network side had time
 *       to go idle, as a program that connects now and then makes them.
 *
 * The server closes first, as an HTTP server answering `Connection: close` does, so
 * TIME_WAIT is the remote's (where `ferry bench` keeps none), never the client's: a
 * client closing first left ~7k entries a second in the namespace every
 * configuration connects from, whose ~28k ports then came round within seconds, and
 * the configurations that ran next (or the same one later) connected more slowly.
 *
 * Built from this file by `ferry bench` (cc -O2) when R2 runs; plain libc, nothing
 * else, so every configuration runs the same client binary. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static int addr_of(const char *ip, const char *port, struct sockaddr_in *sa)
{
	char *end;
	long p = strtol(port, &end, 10);

	memset(sa, 0, sizeof(*sa));
	sa->sin_family = AF_INET;
	if (*end || p <= 0 || p > 65535 || inet_pton(AF_INET, ip, &sa->sin_addr) != 1) {
		fprintf(stderr, "ferry-shortconn: bad address %s:%s\n", ip, port);
		return -1;
	}
	sa->sin_port = htons((unsigned short)p);
	return 0;
}

static double now(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static int serve(const struct sockaddr_in *sa)
{
	int one = 1, l = socket(AF_INET, SOCK_STREAM, 0);

	if (l < 0 || setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) ||
	    bind(l, (const struct sockaddr *)sa, sizeof(*sa)) || listen(l, 4096)) {
		perror("ferry-shortconn server: listen");
		return 1;
	}
	for (;;) {
		char b;
		int c = accept(l, NULL, NULL);

		if (c < 0) {
			if (errno == EINTR || errno == ECONNABORTED || errno == EMFILE)
				continue;
			perror("ferry-shortconn server: accept");
			return 1;
		}
		if (read(c, &b, 1) == 1 && write(c, &b, 1) != 1)
			perror("ferry-shortconn server: write");
		close(c);
	}
}

/* Seconds spent in each phase of a connection, summed over the connections:
 * socket, connect, exchange (write + reply), end of stream, close. */
static double phase[5];

static int one_connection(const struct sockaddr_in *sa)
{
	char b = 'x';
	double t[6];
	int s, i;

	t[0] = now();
	s = socket(AF_INET, SOCK_STREAM, 0);
	t[1] = now();

	if (s < 0) {
		perror("ferry-shortconn client: socket");
		return -1;
	}
	if (connect(s, (const struct sockaddr *)sa, sizeof(*sa))) {
		perror("ferry-shortconn client: connect");
		close(s);
		return -1;
	}
	t[2] = now();
	if (write(s, &b, 1) != 1 || read(s, &b, 1) != 1) {
		perror("ferry-shortconn client: request/reply");
		close(s);
		return -1;
	}
	t[3] = now();
	if (read(s, &b, 1) != 0) {
		fprintf(stderr, "ferry-shortconn client: no end of stream after the reply\n");
		close(s);
		return -1;
	}
	t[4] = now();
	close(s);
	t[5] = now();
	for (i = 0; i < 5; i++)
		phase[i] += t[i + 1] - t[i];
	return 0;
}

static int client(const struct sockaddr_in *sa, const char *secs, const char *pause)
{
	char *end;
	double span = strtod(secs, &end), start, t;
	unsigned long n = 0;
	long pause_us = 0;
	struct timespec gap;

	if (*end || span <= 0) {
		fprintf(stderr, "ferry-shortconn: bad seconds %s\n", secs);
		return 2;
	}
	if (pause) {
		pause_us = strtol(pause, &end, 10);
		if (*end || pause_us <= 0 || pause_us >= 1000000) {
			fprintf(stderr, "ferry-shortconn: bad pause %s (1 to 999999 us)\n", pause);
			return 2;
		}
	}
	gap.tv_sec = 0;
	gap.tv_nsec = pause_us * 1000;
	start = now();
	do {
		if (one_connection(sa))
			return 1;
		n++;
		if (pause_us)
			nanosleep(&gap, NULL);
		t = now() - start;
	} while (t < span);
	printf("connections %lu seconds %.6f\n", n, t);
	printf("phases-us socket %.2f connect %.2f exchange %.2f end %.2f close %.2f\n",
	       phase[0] * 1e6 / n, phase[1] * 1e6 / n, phase[2] * 1e6 / n, phase[3] * 1e6 / n,
	       phase[4] * 1e6 / n);
	return 0;
}

int main(int argc, char **argv)
{
	struct sockaddr_in sa;

	signal(SIGPIPE, SIG_IGN);
	if (argc == 4 && !strcmp(argv[1], "server")) {
		if (addr_of(argv[2], argv[3], &sa))
			return 2;
		return serve(&sa);
	}
	if ((argc == 5 || argc == 6) && !strcmp(argv[1], "client")) {
		if (addr_of(argv[2], argv[3], &sa))
			return 2;
		return client(&sa, argv[4], argc == 6 ? argv[5] : NULL);
	}
	fprintf(stderr,
		"usage: ferry-shortconn server IP PORT | client IP PORT SECONDS [PAUSE_US]\n");
	return 2;
}
