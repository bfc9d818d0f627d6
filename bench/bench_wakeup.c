/*
 * bench_wakeup.c — the operating system's floor under "server time per streamed token"
 * (issue 13), with no HTTP library and no engine: what one token costs an event loop that
 * is woken for it and sends it, on this host's kernel.
 *
 * Three threads. A producer (the scheduler's stand-in) makes a token every GAP us and
 * wakes the server thread with an eventfd write (what libmicrohttpd's resume does). The
 * server thread sleeps in epoll_wait on that eventfd and one loopback TCP socket, reads
 * the eventfd, formats a ~150-byte SSE chunk like kiln serve's and send()s it; a client
 * thread reads the chunks. Per token it reports the server thread's CPU time
 * (CLOCK_THREAD_CPUTIME_ID around the whole loop, divided by tokens) and the producer's
 * eventfd write, which is exactly the syscall pattern of kiln serve at one stream (strace:
 * epoll_wait, read, sendto, epoll_wait per token).
 *
 *   bench_wakeup [-n TOKENS] [-g GAP_US] [-s STREAMS] [-d]
 *
 * GAP 0 is back to back (warm caches, no idle wakeups); a GAP like a decode step (5000 us
 * for an 8B model on one H100) measures the cold wakeup kiln serve sees at one stream.
 * STREAMS > 1 sends that many chunks (one per socket) per wakeup, like a step that
 * resumes many streams at once. -d (direct): the producer send()s the chunks itself, no
 * eventfd and no server thread — the cost of a design where the thread that made the
 * token writes it to the socket. Errors of any system call end the run with a message.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define MAX_STREAMS 256

typedef struct {
    int efd, epfd, n, gap_us, streams, direct;
    int srv[MAX_STREAMS], cli[MAX_STREAMS];
    double server_cpu, producer_cpu;
    long bytes_read;
    int failed;
} bench;

static double cpu_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static void die(const char *what) {
    fprintf(stderr, "bench_wakeup: %s: %s\n", what, strerror(errno));
    exit(1);
}

/* The chunks of token `tok` to every stream (kiln serve's SSE chunk, ~150 bytes). */
static void send_token(bench *b, int tok) {
    char chunk[512];
    for (int s = 0; s < b->streams; s++) {
        int len = snprintf(chunk, sizeof chunk,
                           "data: {\"id\":\"cmpl-%d\",\"object\":\"chat.completion.chunk\","
                           "\"created\":1764100000,\"model\":\"m\",\"choices\":[{\"index\":0,"
                           "\"delta\":{\"content\":\" tok%d\"},\"finish_reason\":null}]}\n\n",
                           s, tok);
        if (send(b->srv[s], chunk, (size_t)len, MSG_NOSIGNAL) != len) die("send");
    }
}

static void *producer(void *arg) {
    bench *b = arg;
    double cpu = 0;
    for (int i = 0; i < b->n; i++) {
        if (b->gap_us > 0) {
            struct timespec ts = {b->gap_us / 1000000, (long)(b->gap_us % 1000000) * 1000};
            nanosleep(&ts, NULL);
        }
        const double t0 = cpu_now();
        if (b->direct) {
            send_token(b, i);
        } else {
            uint64_t one = 1;
            if (write(b->efd, &one, 8) != 8) die("eventfd write");
        }
        cpu += cpu_now() - t0;
    }
    b->producer_cpu = cpu;
    return NULL;
}

static void *client(void *arg) {
    bench *b = arg;
    char buf[65536];
    long got = 0;
    int ep = epoll_create1(0);
    if (ep < 0) die("epoll_create1 (client)");
    for (int s = 0; s < b->streams; s++) {
        struct epoll_event ev = {.events = EPOLLIN, .data.fd = b->cli[s]};
        if (epoll_ctl(ep, EPOLL_CTL_ADD, b->cli[s], &ev)) die("epoll_ctl (client)");
    }
    int open = b->streams;
    while (open > 0) {
        struct epoll_event evs[64];
        int k = epoll_wait(ep, evs, 64, -1);
        if (k < 0 && errno == EINTR) continue;
        if (k < 0) die("epoll_wait (client)");
        for (int i = 0; i < k; i++) {
            ssize_t r = read(evs[i].data.fd, buf, sizeof buf);
            if (r < 0 && errno == EAGAIN) continue;
            if (r < 0) die("read (client)");
            if (r == 0) {
                epoll_ctl(ep, EPOLL_CTL_DEL, evs[i].data.fd, NULL);
                open--;
            }
            got += r;
        }
    }
    close(ep);
    b->bytes_read = got;
    return NULL;
}

static void socket_pair(int *srv, int *cli) {
    int l = socket(AF_INET, SOCK_STREAM, 0);
    if (l < 0) die("socket");
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t al = sizeof a;
    if (bind(l, (struct sockaddr *)&a, sizeof a) || listen(l, 1) ||
        getsockname(l, (struct sockaddr *)&a, &al))
        die("bind/listen");
    *cli = socket(AF_INET, SOCK_STREAM, 0);
    if (*cli < 0 || connect(*cli, (struct sockaddr *)&a, sizeof a)) die("connect");
    *srv = accept(l, NULL, NULL);
    if (*srv < 0) die("accept");
    close(l);
    int one = 1; /* as libmicrohttpd sets for its sockets */
    setsockopt(*srv, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

int main(int argc, char **argv) {
    bench b = {.n = 2000, .gap_us = 5000, .streams = 1};
    for (int o; (o = getopt(argc, argv, "n:g:s:d")) != -1;) {
        if (o == 'n')
            b.n = atoi(optarg);
        else if (o == 'g')
            b.gap_us = atoi(optarg);
        else if (o == 's')
            b.streams = atoi(optarg);
        else if (o == 'd')
            b.direct = 1;
        else {
            fprintf(stderr, "usage: bench_wakeup [-n TOKENS] [-g GAP_US] [-s STREAMS] [-d]\n");
            return 2;
        }
    }
    if (b.n < 1 || b.gap_us < 0 || b.streams < 1 || b.streams > MAX_STREAMS) {
        fprintf(stderr, "bench_wakeup: -n >= 1, -g >= 0, 1 <= -s <= %d\n", MAX_STREAMS);
        return 2;
    }
    for (int s = 0; s < b.streams; s++) socket_pair(&b.srv[s], &b.cli[s]);
    b.efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    b.epfd = epoll_create1(EPOLL_CLOEXEC);
    if (b.efd < 0 || b.epfd < 0) die("eventfd/epoll_create1");
    struct epoll_event ev = {.events = EPOLLIN, .data.fd = b.efd};
    if (epoll_ctl(b.epfd, EPOLL_CTL_ADD, b.efd, &ev)) die("epoll_ctl");
    for (int s = 0; s < b.streams; s++) { /* as MHD watches its connections */
        struct epoll_event e2 = {.events = EPOLLIN | EPOLLET, .data.fd = b.srv[s]};
        if (epoll_ctl(b.epfd, EPOLL_CTL_ADD, b.srv[s], &e2)) die("epoll_ctl (socket)");
    }
    pthread_t tp, tc;
    if (pthread_create(&tc, NULL, client, &b) || pthread_create(&tp, NULL, producer, &b)) {
        fprintf(stderr, "bench_wakeup: pthread_create failed\n");
        return 1;
    }
    const double c0 = cpu_now();
    int tokens = 0, wakeups = 0;
    while (!b.direct && tokens < b.n) {
        struct epoll_event evs[8];
        int k = epoll_wait(b.epfd, evs, 8, -1);
        if (k < 0 && errno == EINTR) continue;
        if (k < 0) die("epoll_wait");
        wakeups++;
        for (int i = 0; i < k; i++) {
            if (evs[i].data.fd != b.efd) continue;
            uint64_t cnt = 0;
            if (read(b.efd, &cnt, 8) != 8) continue; /* EAGAIN: counted already */
            for (uint64_t t = 0; t < cnt && tokens < b.n; t++, tokens++) send_token(&b, tokens);
        }
    }
    if (b.direct) pthread_join(tp, NULL);
    const double cpu = cpu_now() - c0;
    if (!b.direct) pthread_join(tp, NULL);
    for (int s = 0; s < b.streams; s++) close(b.srv[s]);
    pthread_join(tc, NULL);
    const double per_tok = cpu / b.n * 1e6, per_chunk = cpu / ((double)b.n * b.streams) * 1e6;
    if (b.direct)
        printf("bench_wakeup -d: %d tokens x %d streams, gap %d us: the producer's send of a "
               "token %.2f us CPU (%.2f us per chunk), client got %ld bytes\n",
               b.n, b.streams, b.gap_us, b.producer_cpu / b.n * 1e6,
               b.producer_cpu / ((double)b.n * b.streams) * 1e6, b.bytes_read);
    else
        printf("bench_wakeup: %d tokens x %d streams, gap %d us, %d wakeups: server thread %.2f "
               "us CPU per token (%.2f us per chunk sent), producer eventfd write %.2f us, "
               "client got %ld bytes\n",
               b.n, b.streams, b.gap_us, wakeups, per_tok, per_chunk, b.producer_cpu / b.n * 1e6,
               b.bytes_read);
    return 0;
}
