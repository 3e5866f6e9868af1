/* Baselines for bench/ipc.py: what the hardware and kernel give before
 * bulkhead adds anything.
 *   (a) round trip of a 64-byte message over an AF_UNIX SOCK_SEQPACKET
 *       socketpair between two processes (fork), blocking send/recv, the
 *       median of N per-iteration samples after a warm-up;
 *   (b) one 64 MiB memcpy between two already-touched buffers (median).
 *
 * (c) the same round trip, same CPU, over two anonymous pipes
 *     (read/write): not a baseline for a target, it shows what a transport
 *     without the socket's costs (and without its credentials and fd
 *     passing) would give (pipe_same_cpu_us).
 *
 * (a) is measured three times: with the scheduler's own placement
 * (pingpong_median_us, the headline), with both processes pinned to one
 * CPU, and pinned to two different CPUs.  On small VMs the two placements
 * differ by an order of magnitude (waking an idle vCPU costs tens of us),
 * and the scheduler picks one or the other per run, so the pinned figures
 * are the stable ones to compare against.  A figure that cannot be
 * measured (one CPU only) is null.
 *
 * Prints one JSON object:
 *   {"pingpong_median_us": ..., "pingpong_same_cpu_us": ...,
 *    "pingpong_cross_cpu_us": ..., "pipe_same_cpu_us": ..., "memcpy_64m_ms": ...}
 * Usage: pingpong [round_trips [memcpy_reps]]
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MSG 64
#define WARMUP 2000
#define BIG ((size_t)64 << 20)

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

static double median_ns(uint64_t *v, size_t n)
{
    qsort(v, n, sizeof *v, cmp_u64);
    return n % 2 ? (double)v[n / 2] : ((double)v[n / 2 - 1] + (double)v[n / 2]) / 2.0;
}

static void die(const char *what)
{
    perror(what);
    exit(1);
}

static int use_pipes; /* read/write on pipes instead of send/recv */

static void xsend(int fd, const void *buf, size_t n)
{
    for (;;) {
        ssize_t r = use_pipes ? write(fd, buf, n) : send(fd, buf, n, 0);
        if (r == (ssize_t)n)
            return;
        if (r < 0 && errno == EINTR)
            continue;
        die("send");
    }
}

/* Returns 0 on EOF. */
static int xrecv(int fd, void *buf, size_t n)
{
    for (;;) {
        ssize_t r = use_pipes ? read(fd, buf, n) : recv(fd, buf, n, 0);
        if (r == (ssize_t)n)
            return 1;
        if (r == 0)
            return 0;
        if (r < 0 && errno == EINTR)
            continue;
        die("recv");
    }
}

enum { PLACE_DEFAULT, PLACE_SAME, PLACE_CROSS };

static int pin(int cpu)
{
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    return sched_setaffinity(0, sizeof set, &set);
}

/* The first two CPUs this process may run on; -1 where there is none. */
static void allowed_cpus(cpu_set_t *orig, int *a, int *b)
{
    *a = *b = -1;
    if (sched_getaffinity(0, sizeof *orig, orig) != 0)
        die("sched_getaffinity");
    for (int i = 0; i < CPU_SETSIZE; i++) {
        if (!CPU_ISSET(i, orig))
            continue;
        if (*a < 0)
            *a = i;
        else if (*b < 0) {
            *b = i;
            break;
        }
    }
}

/* The two ends: the parent uses sv[0] to send and rv[0] to receive, the
 * child rv[1] and sv[1] (one socketpair: sv = rv; pipes: one each way). */
static void make_ends(int sv[2], int rv[2])
{
    if (!use_pipes) {
        if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0)
            die("socketpair");
        rv[0] = sv[0];
        rv[1] = sv[1];
        return;
    }
    int down[2], up[2];
    if (pipe2(down, O_CLOEXEC) != 0 || pipe2(up, O_CLOEXEC) != 0)
        die("pipe2");
    sv[0] = down[1], sv[1] = up[1];  /* parent writes down, child writes up */
    rv[0] = up[0], rv[1] = down[0];
}

static double pingpong(size_t n, int place, int cpu_a, int cpu_b)
{
    int sv[2], rv[2];
    make_ends(sv, rv);
    pid_t pid = fork();
    if (pid < 0)
        die("fork");
    if (pid == 0) {
        char buf[MSG];
        close(sv[0]);
        if (rv[0] != sv[0])
            close(rv[0]);
        if (place != PLACE_DEFAULT && pin(place == PLACE_SAME ? cpu_a : cpu_b) != 0)
            die("sched_setaffinity (child)");
        while (xrecv(rv[1], buf, sizeof buf))
            xsend(sv[1], buf, sizeof buf);
        _exit(0);
    }
    close(sv[1]);
    if (rv[1] != sv[1])
        close(rv[1]);
    if (place != PLACE_DEFAULT && pin(cpu_a) != 0)
        die("sched_setaffinity");
    char msg[MSG], back[MSG];
    memset(msg, 'x', sizeof msg);
    for (int i = 0; i < WARMUP; i++) {
        xsend(sv[0], msg, sizeof msg);
        if (!xrecv(rv[0], back, sizeof back))
            die("child closed");
    }
    uint64_t *t = malloc(n * sizeof *t);
    if (!t)
        die("malloc");
    for (size_t i = 0; i < n; i++) {
        uint64_t t0 = now_ns();
        xsend(sv[0], msg, sizeof msg);
        if (!xrecv(rv[0], back, sizeof back))
            die("child closed");
        t[i] = now_ns() - t0;
    }
    close(sv[0]);
    if (rv[0] != sv[0])
        close(rv[0]);
    int st;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
        ;
    double med = median_ns(t, n);
    free(t);
    return med / 1e3;
}

static double memcpy_64m(size_t reps)
{
    unsigned char *src = malloc(BIG), *dst = malloc(BIG);
    if (!src || !dst)
        die("malloc");
    memset(src, 1, BIG);
    memset(dst, 2, BIG);
    memcpy(dst, src, BIG); /* warm-up */
    uint64_t *t = malloc(reps * sizeof *t);
    if (!t)
        die("malloc");
    for (size_t i = 0; i < reps; i++) {
        src[i % BIG] = (unsigned char)i;
        uint64_t t0 = now_ns();
        memcpy(dst, src, BIG);
        t[i] = now_ns() - t0;
        /* keep the copy observable so it is not elided */
        if (dst[i % BIG] != (unsigned char)i)
            die("memcpy check");
    }
    double med = median_ns(t, reps);
    free(t);
    free(src);
    free(dst);
    return med / 1e6;
}

int main(int argc, char **argv)
{
    size_t n = argc > 1 ? strtoul(argv[1], NULL, 10) : 20000;
    size_t reps = argc > 2 ? strtoul(argv[2], NULL, 10) : 15;
    if (n == 0 || reps == 0) {
        fprintf(stderr, "usage: %s [round_trips>0] [memcpy_reps>0]\n", argv[0]);
        return 2;
    }
    cpu_set_t orig;
    int cpu_a, cpu_b;
    char same[32] = "null", cross[32] = "null", piped[32] = "null";
    allowed_cpus(&orig, &cpu_a, &cpu_b);
    double pp = pingpong(n, PLACE_DEFAULT, cpu_a, cpu_b);
    if (cpu_a >= 0)
        snprintf(same, sizeof same, "%.3f", pingpong(n, PLACE_SAME, cpu_a, cpu_b));
    if (cpu_b >= 0)
        snprintf(cross, sizeof cross, "%.3f", pingpong(n, PLACE_CROSS, cpu_a, cpu_b));
    if (cpu_a >= 0) {
        use_pipes = 1;
        snprintf(piped, sizeof piped, "%.3f", pingpong(n, PLACE_SAME, cpu_a, cpu_b));
        use_pipes = 0;
    }
    if (sched_setaffinity(0, sizeof orig, &orig) != 0)
        die("sched_setaffinity (restore)");
    double mc = memcpy_64m(reps);
    printf("{\"pingpong_median_us\": %.3f, \"pingpong_same_cpu_us\": %s, "
           "\"pingpong_cross_cpu_us\": %s, \"pipe_same_cpu_us\": %s, \"memcpy_64m_ms\": %.3f}\n",
           pp, same, cross, piped, mc);
    return 0;
}
