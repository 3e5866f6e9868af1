/* The C core's own round trip, for bench/ipc.py: what bulkhead's channel
 * (src/core/channel.c: framing, peer credentials, block bookkeeping, the
 * spin-or-block wait) costs before any Python runs.
 *
 *   coreecho pingpong N   N CALL -> RESULT round trips (nil values) between
 *                         two processes through bh_channel_send/recv, both
 *                         pinned to one CPU and then to two; prints
 *                         {"core_same_cpu_us": ..., "core_cross_cpu_us": ...}
 *                         (null where there is one CPU only)
 *   coreecho echo FD PID  answers every request on channel fd FD (frames
 *                         must come from PID) with RESULT nil, until EOF:
 *                         the peer ipc.py times a Python host against
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "bulkhead/bulkhead.h"

#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define WARMUP 2000

static const uint8_t nil = BH_TAG_NIL;

static void die(const char *what, int rc)
{
    fprintf(stderr, "coreecho: %s: %s\n", what, rc < 0 ? bh_strerror(rc) : strerror(errno));
    exit(1);
}

static int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

static void pin(int cpu)
{
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    if (sched_setaffinity(0, sizeof set, &set) != 0)
        die("sched_setaffinity", 0);
}

static int echo(bh_channel *c)
{
    for (;;) {
        bh_frame f;
        int rc = bh_channel_recv(c, &f, -1);
        if (rc == -EINTR)
            continue;
        if (rc == -BH_EEOF)
            return 0;
        if (rc < 0)
            die("recv", rc);
        bh_msg m = {.kind = BH_KIND_RESULT, .request_id = f.h.request_id, .value = &nil,
                    .value_len = 1};
        bh_channel_frame_done(c, &f);
        if (f.h.kind != BH_KIND_CALL)
            continue;
        rc = bh_channel_send(c, &m);
        if (rc == -BH_EEOF)
            return 0;
        if (rc < 0)
            die("send", rc);
    }
}

static bh_channel *open_end(int fd, pid_t peer)
{
    bh_channel *c;
    bh_channel_opts o = {.peer_uid = getuid(), .peer_pid = peer};
    int rc = bh_channel_open(&c, fd, &o);
    if (rc < 0)
        die("bh_channel_open", rc);
    return c;
}

/* Median round trip (us) with the child on CPU cpu_child, us on cpu_us;
 * both channel ends are opened while free to run anywhere (*orig). */
static double pingpong(size_t n, int cpu_us, int cpu_child, const cpu_set_t *orig)
{
    if (sched_setaffinity(0, sizeof *orig, orig) != 0)
        die("sched_setaffinity", 0);
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0)
        die("socketpair", 0);
    pid_t parent = getpid(), pid = fork();
    if (pid < 0)
        die("fork", 0);
    if (pid == 0) {
        close(sv[0]);
        bh_channel *c = open_end(sv[1], parent); /* before pinning: as a worker, free to spin */
        pin(cpu_child);
        int rc = echo(c);
        bh_channel_close(c);
        _exit(rc);
    }
    close(sv[1]);
    bh_channel *c = open_end(sv[0], pid);
    pin(cpu_us);
    int64_t *t = malloc(n * sizeof *t);
    if (!t)
        die("malloc", 0);
    for (long i = -WARMUP; i < (long)n; i++) {
        int64_t t0 = now_ns();
        bh_msg m = {.kind = BH_KIND_CALL, .request_id = (uint64_t)(i + WARMUP + 1), .value = &nil,
                    .value_len = 1};
        int rc = bh_channel_send(c, &m);
        if (rc < 0)
            die("send", rc);
        bh_frame f;
        while ((rc = bh_channel_recv(c, &f, -1)) == -EINTR)
            ;
        if (rc < 0)
            die("recv", rc);
        bh_channel_frame_done(c, &f);
        if (i >= 0)
            t[i] = now_ns() - t0;
    }
    bh_channel_close(c);
    int st;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
        ;
    qsort(t, n, sizeof *t, cmp_i64);
    double med = n % 2 ? (double)t[n / 2] : ((double)t[n / 2 - 1] + (double)t[n / 2]) / 2.0;
    free(t);
    return med / 1e3;
}

int main(int argc, char **argv)
{
    if (argc == 4 && strcmp(argv[1], "echo") == 0) {
        bh_channel *c = open_end(atoi(argv[2]), (pid_t)atol(argv[3]));
        int rc = echo(c);
        bh_channel_close(c);
        return rc;
    }
    size_t n = argc == 3 && strcmp(argv[1], "pingpong") == 0 ? strtoul(argv[2], NULL, 10) : 0;
    if (n == 0) {
        fprintf(stderr, "usage: %s pingpong N | %s echo FD PEER_PID\n", argv[0], argv[0]);
        return 2;
    }
    cpu_set_t orig;
    if (sched_getaffinity(0, sizeof orig, &orig) != 0)
        die("sched_getaffinity", 0);
    int a = -1, b = -1;
    for (int i = 0; i < CPU_SETSIZE && b < 0; i++)
        if (CPU_ISSET(i, &orig)) {
            if (a < 0)
                a = i;
            else
                b = i;
        }
    char same[32] = "null", cross[32] = "null";
    if (a >= 0)
        snprintf(same, sizeof same, "%.3f", pingpong(n, a, a, &orig));
    if (b >= 0)
        snprintf(cross, sizeof cross, "%.3f", pingpong(n, a, b, &orig));
    printf("{\"core_same_cpu_us\": %s, \"core_cross_cpu_us\": %s}\n", same, cross);
    return 0;
}
