/*
 * runner.c -- runs the C tests listed in test-list.h.
 *
 *   bh-tests              run every test
 *   bh-tests NAME...      run the tests named (shell patterns allowed:
 *                         'codec_*'), showing their output
 *   bh-tests --list       print the names
 *
 * Each test runs in a child of its own (fork, no exec): a process group of
 * its own, stdin from /dev/null, stdout and stderr into a memfd the runner
 * reads back.  The runner waits on a pidfd (or polls waitpid where pidfds
 * are missing) until the test's timeout, then kills the whole group and
 * reports the test as timed out.  A test's output is printed when it fails
 * (always, for tests named on the command line).
 *
 * One line per test, then exactly one summary line, last:
 *
 *   ok 1 - codec_roundtrip_scalars (2 ms)
 *   not ok 2 - channel_deadline: exit code 1 (51 ms)
 *   ...
 *   41 passed, 1 failed
 *
 * BH_TEST_TIMEOUT_SCALE (a number, default 1) multiplies every timeout,
 * for slow machines and sanitizer builds.
 *
 * Skipped tests count as passed ("ok N - name # SKIP").  The exit status is
 * 0 when nothing failed, 1 otherwise, 2 for a usage error.  (libuv
 * test/runner.c, test/runner-unix.c.)
 */
#include "task.h"

#include <dirent.h>
#include <fcntl.h>
#include <fnmatch.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>

typedef struct task_entry {
  const char *name;
  int (*main)(void);
  int timeout_ms;
} task_entry_t;

#define BH_TEST_DEFAULT_TIMEOUT_MS 10000

#define TASK_LIST_START static const task_entry_t TASKS[] = {
#define TEST_ENTRY(name) {#name, run_test_##name, BH_TEST_DEFAULT_TIMEOUT_MS},
#define TEST_ENTRY_CUSTOM(name, timeout_ms) {#name, run_test_##name, (timeout_ms)},
#define TASK_LIST_END {NULL, NULL, 0}};

#include "test-list.h"

/* ---- helpers for the tests (declared in task.h) ---- */

const char *bh_test_errname(int rc) {
  if (rc == 0) return "0";
  const char *n = bh_errname(rc);
  return n ? n : "?";
}

int bh_test_fd_count(void) {
  DIR *d = opendir("/proc/self/fd");
  if (!d) return -1;
  int n = 0;
  struct dirent *e;
  while ((e = readdir(d)) != NULL)
    if (e->d_name[0] != '.') n++;
  closedir(d);
  return n - 1; /* the directory's own fd */
}

void bh_test_fd_dump(const char *why) {
  DIR *d = opendir("/proc/self/fd");
  if (!d) return;
  fprintf(stderr, "%s:\n", why);
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    if (e->d_name[0] == '.' || atoi(e->d_name) == dirfd(d)) continue;
    char path[300], target[256];
    snprintf(path, sizeof path, "/proc/self/fd/%s", e->d_name);
    ssize_t n = readlink(path, target, sizeof target - 1);
    target[n < 0 ? 0 : n] = 0;
    fprintf(stderr, "    %s -> %s\n", e->d_name, target);
  }
  closedir(d);
}

int64_t bh_test_now_ms(void) { return bh_now_ns() / 1000000; }

void bh_test_sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) < 0 && errno == EINTR) {
  }
}

/* ---- running one test ---- */

enum { RES_PASS, RES_SKIP, RES_FAIL };

static int pidfd_open_(pid_t pid) {
#ifdef SYS_pidfd_open
  return (int)syscall(SYS_pidfd_open, pid, 0);
#else
  (void)pid;
  errno = ENOSYS;
  return -1;
#endif
}

/* In the test's child: a clean slate, then the test. */
static void child_main(const task_entry_t *t, int out_fd) {
  setpgid(0, 0);
  int devnull = open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (devnull >= 0) dup2(devnull, 0), close(devnull);
  dup2(out_fd, 1);
  dup2(out_fd, 2);
  close(out_fd);
  /* fds we inherited from whoever started us (meson, a shell) are not the
   * tests' to count or to hand to the processes they spawn. */
  DIR *d = opendir("/proc/self/fd");
  if (d) {
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
      int fd = atoi(e->d_name);
      if (e->d_name[0] != '.' && fd > 2 && fd != dirfd(d))
        fcntl(fd, F_SETFD, FD_CLOEXEC);
    }
    closedir(d);
  }
  setvbuf(stdout, NULL, _IONBF, 0);
  setvbuf(stderr, NULL, _IONBF, 0);
  signal(SIGPIPE, SIG_IGN);
  int rc = t->main();
  fflush(NULL);
  exit(rc == TEST_SKIP ? TEST_SKIP : rc ? 1 : 0);
}

/* Processes a test left behind in groups of their own (workers it
 * spawned) are reparented to the runner, a child subreaper, when the
 * test's process ends: kill and reap them.  Returns how many. */
static int reap_strays(void) {
  char path[64];
  int n = 0, pid;
  snprintf(path, sizeof path, "/proc/self/task/%d/children", (int)getpid());
  FILE *f = fopen(path, "re");
  if (!f) return 0;
  while (fscanf(f, "%d", &pid) == 1) {
    kill(pid, SIGKILL);
    while (waitpid(pid, NULL, 0) < 0 && errno == EINTR) {
    }
    n++;
  }
  fclose(f);
  return n;
}

static void print_output(int fd) {
  char buf[4096];
  off_t off = 0;
  int at_line_start = 1;
  for (;;) {
    ssize_t n = pread(fd, buf, sizeof buf, off);
    if (n <= 0) break;
    off += n;
    for (ssize_t i = 0; i < n; i++) {
      if (at_line_start) fputs("#   ", stdout);
      fputc(buf[i], stdout);
      at_line_start = buf[i] == '\n';
    }
  }
  if (!at_line_start) fputc('\n', stdout);
}

/* Waits for pid until timeout_ms; returns 1 with *status, 0 on timeout,
 * -errno if waitpid fails. */
static int wait_child(pid_t pid, int timeout_ms, int *status) {
  int64_t deadline = bh_test_now_ms() + timeout_ms;
  int pidfd = pidfd_open_(pid);
  for (;;) {
    pid_t r = waitpid(pid, status, WNOHANG);
    if (r == pid) break;
    if (r < 0 && errno != EINTR) {
      int e = errno;
      if (pidfd >= 0) close(pidfd);
      return -e;
    }
    int64_t left = deadline - bh_test_now_ms();
    if (left <= 0) {
      if (pidfd >= 0) close(pidfd);
      return 0;
    }
    if (pidfd >= 0) {
      struct pollfd pf = {pidfd, POLLIN, 0};
      poll(&pf, 1, (int)left);
    } else {
      bh_test_sleep_ms(left < 5 ? (int)left : 5);
    }
  }
  if (pidfd >= 0) close(pidfd);
  return 1;
}

static double timeout_scale(void) {
  const char *s = getenv("BH_TEST_TIMEOUT_SCALE");
  double k = s ? strtod(s, NULL) : 1.0;
  return k > 0 ? k : 1.0;
}

static int run_one(const task_entry_t *t, int index, int verbose) {
  int timeout_ms = (int)(t->timeout_ms * timeout_scale());
  if (timeout_ms < 1) timeout_ms = 1;
  int out_fd = memfd_create("bh-test-output", MFD_CLOEXEC);
  if (out_fd < 0) {
    printf("not ok %d - %s: memfd_create: %s\n", index, t->name, strerror(errno));
    return RES_FAIL;
  }
  fflush(stdout);
  fflush(stderr);
  int64_t start = bh_now_ns();
  pid_t pid = fork();
  if (pid < 0) {
    printf("not ok %d - %s: fork: %s\n", index, t->name, strerror(errno));
    close(out_fd);
    return RES_FAIL;
  }
  if (pid == 0) child_main(t, out_fd);
  setpgid(pid, pid); /* also here, so the kill below cannot miss */

  int status = 0, res;
  char why[128] = "";
  int waited = wait_child(pid, timeout_ms, &status);
  if (waited < 0) {
    snprintf(why, sizeof why, "waitpid: %s", strerror(-waited));
    res = RES_FAIL;
  } else if (waited == 0) {
    kill(-pid, SIGKILL);
    kill(pid, SIGKILL);
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    snprintf(why, sizeof why, "timed out after %d ms (killed)", timeout_ms);
    res = RES_FAIL;
  } else if (WIFEXITED(status) && WEXITSTATUS(status) == 0) {
    res = RES_PASS;
  } else if (WIFEXITED(status) && WEXITSTATUS(status) == TEST_SKIP) {
    res = RES_SKIP;
  } else if (WIFEXITED(status)) {
    snprintf(why, sizeof why, "exit code %d", WEXITSTATUS(status));
    res = RES_FAIL;
  } else if (WIFSIGNALED(status)) {
    snprintf(why, sizeof why, "killed by signal %d (%s)", WTERMSIG(status),
             strsignal(WTERMSIG(status)));
    res = RES_FAIL;
  } else {
    snprintf(why, sizeof why, "unexpected wait status 0x%x", status);
    res = RES_FAIL;
  }
  /* Helpers the test left behind in its group go with it, the rest
   * after. */
  kill(-pid, SIGKILL);
  int strays = reap_strays();
  long ms = (long)((bh_now_ns() - start) / 1000000);

  if (res == RES_PASS)
    printf("ok %d - %s (%ld ms)\n", index, t->name, ms);
  else if (res == RES_SKIP)
    printf("ok %d - %s # SKIP (%ld ms)\n", index, t->name, ms);
  else
    printf("not ok %d - %s: %s (%ld ms)\n", index, t->name, why, ms);
  if (verbose || res != RES_PASS) print_output(out_fd);
  if (strays) printf("#   (%d process%s it left behind killed)\n", strays, strays > 1 ? "es" : "");
  fflush(stdout);
  close(out_fd);
  return res;
}

static int selected(const char *name, int argc, char **argv) {
  if (argc < 2) return 1;
  for (int i = 1; i < argc; i++)
    if (strcmp(argv[i], name) == 0 || fnmatch(argv[i], name, 0) == 0) return 1;
  return 0;
}

int main(int argc, char **argv) {
  if (argc == 2 && strcmp(argv[1], "--list") == 0) {
    for (const task_entry_t *t = TASKS; t->name; t++) puts(t->name);
    return 0;
  }
  if (argc >= 2 && argv[1][0] == '-') {
    fprintf(stderr, "usage: %s [--list] [NAME|PATTERN...]\n", argv[0]);
    return 2;
  }
  int total = 0;
  for (const task_entry_t *t = TASKS; t->name; t++) total += selected(t->name, argc, argv);
  if (total == 0) {
    fprintf(stderr, "%s: no test matches; --list shows the names\n", argv[0]);
    return 2;
  }
  /* A killed test's helpers must not take the runner with them. */
  signal(SIGPIPE, SIG_IGN);
  prctl(PR_SET_CHILD_SUBREAPER, 1);
  printf("1..%d\n", total);
  int passed = 0, failed = 0, skipped = 0, index = 0;
  for (const task_entry_t *t = TASKS; t->name; t++) {
    if (!selected(t->name, argc, argv)) continue;
    int r = run_one(t, ++index, argc >= 2);
    if (r == RES_FAIL) failed++;
    else passed++, skipped += r == RES_SKIP;
  }
  if (skipped) printf("# %d of the passed tests were skipped\n", skipped);
  printf("%d passed, %d failed\n", passed, failed);
  fflush(stdout);
  return failed ? 1 : 0;
}
