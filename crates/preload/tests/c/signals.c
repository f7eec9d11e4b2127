/* Signal semantics under the shim, from C (Python cannot run a handler inside a system
 * call). Usage: signals SILENT_PORT ECHO_PORT CLOSING_PORT. Prints one line per check. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

static int s_echo;
static volatile sig_atomic_t nested_ok, usr1_count, pipe_count;

static int dial(int port) {
    int s = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (s < 0 || connect(s, (struct sockaddr *)&a, sizeof a) != 0) {
        perror("dial");
        exit(2);
    }
    return s;
}

/* Runs inside the signal handler while main is blocked in recv on another socket. */
static void on_alarm(int sig) {
    (void)sig;
    char buf[6];
    int saved = errno;
    if (send(s_echo, "nested", 6, 0) == 6 && recv(s_echo, buf, 6, MSG_WAITALL) == 6 &&
        memcmp(buf, "nested", 6) == 0)
        nested_ok = 1;
    errno = saved;
}

static void on_usr1(int sig) { (void)sig; usr1_count++; }
static void on_pipe(int sig) { (void)sig; pipe_count++; }

/* Interrupts the main thread, then lets its receive complete. */
static void *poke(void *arg) {
    pthread_t main_thread = *(pthread_t *)arg;
    usleep(200000);
    pthread_kill(main_thread, SIGUSR1);
    usleep(200000);
    send(s_echo, "late", 4, 0);
    return NULL;
}

int main(int argc, char **argv) {
    if (argc < 4) return 2;
    setvbuf(stdout, NULL, _IONBF, 0);
    int silent = dial(atoi(argv[1]));
    s_echo = dial(atoi(argv[2]));
    char buf[16];

    /* 1. A handler without SA_RESTART interrupts a blocking recv (EINTR), and may itself
     *    use another socket meanwhile (re-entrant call: the shim's spare channel). */
    struct sigaction sa = {.sa_handler = on_alarm};
    sigaction(SIGALRM, &sa, NULL);

    /* 0. The program sees its own handlers and flags (the shim's wrapper is hidden). */
    struct sigaction q;
    sigaction(SIGALRM, NULL, &q);
    int own = q.sa_handler == on_alarm && !(q.sa_flags & SA_SIGINFO);
    void (*prev)(int) = signal(SIGUSR2, on_usr1);
    void (*prev2)(int) = signal(SIGUSR2, SIG_DFL);
    printf("own %s\n", own && prev == SIG_DFL && prev2 == on_usr1 ? "yes" : "no");

    struct itimerval it = {.it_value = {.tv_usec = 200000}};
    setitimer(ITIMER_REAL, &it, NULL);
    ssize_t r = recv(silent, buf, sizeof buf, 0);
    printf("eintr %s nested %s\n", r < 0 && errno == EINTR ? "yes" : "no", nested_ok ? "yes" : "no");

    /* 2. With SA_RESTART on every handler, the interrupted recv goes on. */
    sa.sa_handler = SIG_DFL;
    sigaction(SIGALRM, &sa, NULL);
    struct sigaction su = {.sa_handler = on_usr1, .sa_flags = SA_RESTART};
    sigaction(SIGUSR1, &su, NULL);
    pthread_t self = pthread_self(), th;
    pthread_create(&th, NULL, poke, &self);
    r = recv(s_echo, buf, sizeof buf, 0);
    pthread_join(th, NULL);
    printf("restart %s handler %d\n", r == 4 && memcmp(buf, "late", 4) == 0 ? "yes" : "no", (int)usr1_count);

    /* 3. Sending on a connection the peer closed: EPIPE, with SIGPIPE unless MSG_NOSIGNAL. */
    int closing = dial(atoi(argv[3]));
    struct sigaction sp = {.sa_handler = on_pipe};
    sigaction(SIGPIPE, &sp, NULL);
    int err = 0;
    for (int i = 0; i < 200 && !err; i++) {
        if (send(closing, "x", 1, MSG_NOSIGNAL) < 0) err = errno;
        usleep(10000);
    }
    printf("broken %s nosignal-quiet %s\n", err == EPIPE || err == ECONNRESET ? "yes" : strerror(err),
           pipe_count == 0 ? "yes" : "no");
    int closing2 = dial(atoi(argv[3]));
    err = 0;
    for (int i = 0; i < 200 && !err; i++) {
        if (send(closing2, "x", 1, 0) < 0) err = errno;
        usleep(10000);
    }
    printf("sigpipe %s\n", err != EPIPE || pipe_count > 0 ? "yes" : "no");
    return 0;
}
