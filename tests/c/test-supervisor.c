/*
 * test-supervisor.c -- spawning, watching and stopping a worker, with
 * /bin/sh standing in for the interpreter: exit status and output tail,
 * the channel on fd 3 and no other fd inherited, exactly the environment
 * given, cwd, the prefixed copy to a sink, spawn failures that leave no
 * child, and the stop ladder (grace, SIGTERM, SIGKILL) that leaves no
 * zombie.
 *
 * The runner marks every fd it inherited close-on-exec before a test
 * starts, so any fd a spawned child sees beyond 0-3 is bulkhead's (or the
 * test's own) doing.
 */
#include "task.h"

#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>

/* Room for the whole output tail (supervisor.c keeps 8 KiB) and more. */
#define BH_TEST_TAIL 16384

static const char *const env_path[] = {"PATH=/usr/bin:/bin", NULL};

static int spawn_sh_env(const char *script, const char *const *envp, const char *cwd, int sink,
                        const char *prefix, bh_proc **p, int *chan) {
  const char *argv[] = {"sh", "-c", script, NULL};
  bh_spawn_opts o = {.interpreter = "/bin/sh", .argv = argv, .envp = envp, .cwd = cwd,
                     .stderr_sink = sink, .stderr_prefix = prefix};
  return bh_proc_spawn(&o, p, chan);
}

static void spawn_sh(const char *script, bh_proc **p, int *chan) {
  ASSERT_OK(spawn_sh_env(script, env_path, NULL, -1, NULL, p, chan));
  ASSERT_GT(bh_proc_pid(*p), 0);
  ASSERT_GT(*chan, 2);
}

/* The child is gone and reaped: not a zombie, not ours to wait for. */
static void assert_reaped(pid_t pid) {
  errno = 0;
  ASSERT_EQ(waitpid(pid, NULL, WNOHANG), -1);
  ASSERT_EQ(errno, ECHILD);
  ASSERT_EQ(kill(pid, 0), -1);
  ASSERT_EQ(errno, ESRCH);
}

/* Waits until the child's output contains `what`. */
static void wait_output(bh_proc *p, const char *what) {
  char buf[BH_TEST_TAIL];
  for (int i = 0; i < 500; i++) {
    bh_proc_output_tail(p, buf, sizeof buf);
    if (strstr(buf, what)) return;
    bh_test_sleep_ms(10);
  }
  ASSERT_STR_CONTAINS(buf, what);
}

TEST_IMPL(proc_exit_status_and_tail) {
  int fds0 = bh_test_fd_count();
  bh_proc *p;
  int chan, st = -1;
  spawn_sh("echo hello; exit 3", &p, &chan);
  pid_t pid = bh_proc_pid(p);
  ASSERT_OK(bh_proc_wait(p, 10000, &st));
  ASSERT(WIFEXITED(st));
  ASSERT_EQ(WEXITSTATUS(st), 3);
  char buf[256];
  size_t n = bh_proc_output_tail(p, buf, sizeof buf);
  ASSERT_EQ(n, strlen(buf));
  ASSERT_STR_EQ(buf, "hello\n");
  /* Reaped once; later waits give the same status at once. */
  assert_reaped(pid);
  st = -1;
  ASSERT_OK(bh_proc_wait(p, 0, &st));
  ASSERT_EQ(WEXITSTATUS(st), 3);
  ASSERT_OK(bh_proc_wait(p, -1, NULL));
  ASSERT_RC(bh_proc_kill(p, SIGTERM), -ESRCH);
  /* A short buffer gets the last bytes. */
  ASSERT_EQ(bh_proc_output_tail(p, buf, 4), 3);
  ASSERT_STR_EQ(buf, "lo\n");
  ASSERT_EQ(bh_proc_output_tail(p, buf, 0), 0);
  close(chan);
  bh_proc_close(p);
  ASSERT_FD_COUNT(fds0);
  return 0;
}

TEST_IMPL(proc_output_tail_keeps_the_end) {
  bh_proc *p;
  int chan, st;
  spawn_sh("i=0; while [ $i -lt 3000 ]; do echo line$i; i=$((i+1)); done", &p, &chan);
  ASSERT_OK(bh_proc_wait(p, 10000, &st));
  ASSERT_EQ(WEXITSTATUS(st), 0);
  static char buf[20000];
  size_t n = bh_proc_output_tail(p, buf, sizeof buf);
  ASSERT_GE(n, 4096); /* the tail is several KiB */
  ASSERT_EQ(n, strlen(buf));
  const char *end = "line2998\nline2999\n";
  ASSERT_STR_EQ(buf + n - strlen(end), end);
  ASSERT(strstr(buf, "line0\n") == NULL);
  close(chan);
  bh_proc_close(p);
  return 0;
}

/* A HELLO frame (protocol 10, request id 42, empty block section, value nil) as printf
 * escapes: sh writes it to fd 3 in one write. */
#define HELLO_FRAME_PRINTF                                                      \
  "printf '\\102\\114\\110\\113\\012\\000\\001\\000"                            \
  "\\052\\000\\000\\000\\000\\000\\000\\000"                                    \
  "\\000\\000\\000\\000\\021\\000\\000\\000\\000\\000\\000\\000\\000\\000\\000\\000" \
  "\\000\\000\\000\\000\\000\\000\\000\\000\\000\\000\\000\\000\\000\\000\\000\\000\\000' >&3"

TEST_IMPL(proc_channel_on_fd3) {
  int fds0 = bh_test_fd_count();
  bh_proc *p;
  int chan, st;
  /* The child answers only after our first frame: sh does not ask for
   * SCM_CREDENTIALS itself, so its frame carries them only if our end
   * already does (bh_channel_open), which a bulkhead worker's own
   * bh_channel_open makes unnecessary. */
  spawn_sh("test -S /proc/self/fd/3 && echo fd3-is-a-socket; head -c 1 <&3 >/dev/null; "
           HELLO_FRAME_PRINTF, &p, &chan);
  ASSERT(fcntl(chan, F_GETFD) & FD_CLOEXEC);
  bh_channel_opts o = {.peer_uid = getuid(), .peer_pid = bh_proc_pid(p)};
  bh_channel *c;
  ASSERT_OK(bh_channel_open(&c, chan, &o));
  ASSERT_OK(bh_test_send(c, BH_KIND_HELLO, 1, NULL, 0, NULL, 0));
  bh_frame f;
  ASSERT_OK(bh_test_recv(c, &f, 5000));
  ASSERT_EQ(f.h.kind, BH_KIND_HELLO);
  ASSERT_UEQ(f.h.request_id, 42);
  ASSERT_EQ(f.value_len, 1);
  ASSERT_EQ(f.value[0], BH_TAG_NIL);
  ASSERT_EQ(f.sender_pid, bh_proc_pid(p));
  /* The child's death is EOF on the channel. */
  ASSERT_RC(bh_test_recv(c, &f, 5000), -BH_EEOF);
  ASSERT_OK(bh_proc_wait(p, 5000, &st));
  ASSERT_EQ(WEXITSTATUS(st), 0);
  char buf[256];
  bh_proc_output_tail(p, buf, sizeof buf);
  ASSERT_STR_EQ(buf, "fd3-is-a-socket\n");
  bh_channel_close(c);
  bh_proc_close(p);
  ASSERT_FD_COUNT(fds0);
  return 0;
}

/* Parses `ls -l /proc/self/fd` output: fd numbers and targets. */
static int parse_fds(const char *out, int *fds, char targets[][128], int max) {
  int n = 0;
  const char *line = out;
  while (*line && n < max) {
    const char *nl = strchr(line, '\n');
    size_t len = nl ? (size_t)(nl - line) : strlen(line);
    char l[512];
    snprintf(l, sizeof l, "%.*s", (int)len, line);
    char *arrow = strstr(l, " -> ");
    if (arrow) {
      char *num = arrow;
      while (num > l && num[-1] != ' ') num--;
      fds[n] = atoi(num);
      snprintf(targets[n], 128, "%s", arrow + 4);
      n++;
    }
    line += len + (nl ? 1 : 0);
  }
  return n;
}

TEST_IMPL(proc_no_inherited_fds) {
  int fds0 = bh_test_fd_count();
  /* Give bulkhead fds of every kind to leak: a channel pair with a block
   * lent across it, a spilled frame in flight, another worker. */
  bh_channel *a, *b;
  bh_test_pair(&a, &b, 0);
  bh_block *blk;
  ASSERT_OK(bh_channel_block_acquire(a, 4096, &blk));
  static const uint8_t nil = BH_TAG_NIL;
  ASSERT_OK(bh_test_send(a, BH_KIND_RESULT, 1, &nil, 1, &blk, 1));
  size_t big = 100 * 1024;
  uint8_t *v = calloc(1, big);
  ASSERT_NOT_NULL(v);
  v[0] = BH_TAG_BYTES;
  v[3] = 0x01, v[2] = 0x8f, v[1] = 0xfb; /* 102395 = big - 5 */
  ASSERT_OK(bh_test_send(a, BH_KIND_RESULT, 2, v, big, NULL, 0));
  free(v);
  bh_proc *other;
  int other_chan;
  spawn_sh("exec sleep 30", &other, &other_chan);
  int sink[2];
  ASSERT_SYS(pipe2(sink, O_CLOEXEC));

  bh_proc *p;
  int chan, st;
  ASSERT_OK(spawn_sh_env("exec ls -l /proc/self/fd", env_path, NULL, sink[1], "", &p, &chan));
  ASSERT_OK(bh_proc_wait(p, 10000, &st));
  ASSERT_EQ(WEXITSTATUS(st), 0);
  char out[BH_TEST_TAIL];
  bh_proc_output_tail(p, out, sizeof out);
  int fds[64];
  char targets[64][128];
  int n = parse_fds(out, fds, targets, 64);
  int seen[4] = {0}, extra = 0;
  for (int i = 0; i < n; i++) {
    if (fds[i] >= 0 && fds[i] <= 3) {
      seen[fds[i]] = 1;
      continue;
    }
    /* ls's own handle on the directory it lists */
    if (strncmp(targets[i], "/proc/", 6) == 0 && extra == 0) {
      extra = 1;
      continue;
    }
    FAIL("the child inherited fd %d -> %s\n--- ls output ---\n%s", fds[i], targets[i], out);
  }
  for (int i = 0; i < 4; i++)
    if (!seen[i]) FAIL("the child has no fd %d\n--- ls output ---\n%s", i, out);
  for (int i = 0; i < n; i++) {
    if (fds[i] == 0) ASSERT_STR_EQ(targets[i], "/dev/null");
    if (fds[i] == 1 || fds[i] == 2) ASSERT(strncmp(targets[i], "pipe:", 5) == 0);
    if (fds[i] == 3) ASSERT(strncmp(targets[i], "socket:", 7) == 0);
  }
  close(chan);
  bh_proc_close(p);
  close(other_chan);
  bh_proc_close(other);
  close(sink[0]);
  close(sink[1]);
  bh_block_unref(blk);
  bh_channel_close(a);
  bh_channel_close(b);
  ASSERT_FD_COUNT(fds0);
  return 0;
}

/* The host's own inheritable fds (opened without O_CLOEXEC by someone
 * else in the process: a ComfyUI extension, a library) stay home too. */
TEST_IMPL(proc_host_inheritable_fds_stay_home) {
  int opened = open("/dev/null", O_RDONLY); /* no O_CLOEXEC, on purpose */
  ASSERT_GE(opened, 0);
  int low = fcntl(opened, F_DUPFD, 10), high = fcntl(opened, F_DUPFD, 200); /* F_DUPFD: inheritable */
  close(opened);
  ASSERT_GT(low, 9);
  ASSERT_GT(high, 199);
  bh_proc *p;
  int chan, st;
  ASSERT_OK(spawn_sh_env("exec ls -l /proc/self/fd", env_path, NULL, -1, NULL, &p, &chan));
  ASSERT_OK(bh_proc_wait(p, 10000, &st));
  ASSERT_EQ(WEXITSTATUS(st), 0);
  char out[BH_TEST_TAIL];
  bh_proc_output_tail(p, out, sizeof out);
  int fds[64];
  char targets[64][128];
  int n = parse_fds(out, fds, targets, 64);
  ASSERT_GT(n, 3);
  for (int i = 0; i < n; i++)
    if (fds[i] == low || fds[i] == high)
      FAIL("the child inherited the host's fd %d -> %s\n--- ls output ---\n%s", fds[i], targets[i], out);
  close(chan);
  bh_proc_close(p);
  close(low);
  close(high);
  return 0;
}

TEST_IMPL(proc_exact_environment) {
  setenv("HOME", "/root-of-the-test", 1);
  setenv("BH_SHOULD_NOT_LEAK", "1", 1);
  static const char *const envp[] = {"PATH=/usr/bin:/bin", "BH_MARK=42", NULL};
  bh_proc *p;
  int chan, st;
  ASSERT_OK(spawn_sh_env("echo \"mark=$BH_MARK home=${HOME-unset} leak=${BH_SHOULD_NOT_LEAK-unset}\"",
                         envp, NULL, -1, NULL, &p, &chan));
  ASSERT_OK(bh_proc_wait(p, 10000, &st));
  char out[256];
  bh_proc_output_tail(p, out, sizeof out);
  ASSERT_STR_EQ(out, "mark=42 home=unset leak=unset\n");
  close(chan);
  bh_proc_close(p);
  /* An empty environment is allowed too. */
  static const char *const none[] = {NULL};
  ASSERT_OK(spawn_sh_env("echo ${PATH-nopath}", none, NULL, -1, NULL, &p, &chan));
  ASSERT_OK(bh_proc_wait(p, 10000, &st));
  bh_proc_output_tail(p, out, sizeof out);
  ASSERT(strstr(out, "/usr/bin:/bin") == NULL);
  close(chan);
  bh_proc_close(p);
  return 0;
}

TEST_IMPL(proc_spawn_failures) {
  int fds0 = bh_test_fd_count();
  static const struct {
    const char *interp;
    int want;
  } cases[] = {{"/nonexistent/python", -ENOENT},
               {"/etc/passwd", -EACCES}, /* not executable, even for root */
               {"/tmp", -EACCES}};
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
    fprintf(stderr, "case: %s\n", cases[k].interp);
    const char *argv[] = {"python", "-c", "pass", NULL};
    bh_spawn_opts o = {.interpreter = cases[k].interp, .argv = argv, .envp = env_path,
                       .stderr_sink = -1};
    bh_proc *p = (bh_proc *)0x1;
    int chan = -77;
    int64_t start = bh_test_now_ms();
    ASSERT_RC(bh_proc_spawn(&o, &p, &chan), cases[k].want);
    ASSERT_LT(bh_test_now_ms() - start, 2000);
    ASSERT_EQ((uintptr_t)p, 1); /* untouched */
    ASSERT_EQ(chan, -77);
    /* No child left behind, running or zombie. */
    errno = 0;
    ASSERT_EQ(waitpid(-1, NULL, WNOHANG), -1);
    ASSERT_EQ(errno, ECHILD);
    ASSERT_FD_COUNT(fds0);
  }
  /* A cwd that does not exist fails the spawn the same way. */
  bh_proc *p;
  int chan;
  ASSERT_RC(spawn_sh_env("pwd", env_path, "/nonexistent/dir", -1, NULL, &p, &chan), -ENOENT);
  errno = 0;
  ASSERT_EQ(waitpid(-1, NULL, WNOHANG), -1);
  ASSERT_EQ(errno, ECHILD);
  /* Arguments checked before anything happens. */
  const char *argv[] = {"sh", NULL};
  bh_spawn_opts o = {.interpreter = "/bin/sh", .argv = argv, .envp = env_path, .stderr_sink = -1};
  ASSERT_RC(bh_proc_spawn(NULL, &p, &chan), -EINVAL);
  ASSERT_RC(bh_proc_spawn(&o, NULL, &chan), -EINVAL);
  ASSERT_RC(bh_proc_spawn(&o, &p, NULL), -EINVAL);
  o.envp = NULL;
  ASSERT_RC(bh_proc_spawn(&o, &p, &chan), -EINVAL);
  o.envp = env_path;
  o.argv = NULL;
  ASSERT_RC(bh_proc_spawn(&o, &p, &chan), -EINVAL);
  static const char *const empty_argv[] = {NULL};
  o.argv = empty_argv;
  ASSERT_RC(bh_proc_spawn(&o, &p, &chan), -EINVAL);
  o.argv = argv;
  o.interpreter = NULL;
  ASSERT_RC(bh_proc_spawn(&o, &p, &chan), -EINVAL);
  ASSERT_RC(bh_proc_wait(NULL, 0, NULL), -EINVAL);
  ASSERT_RC(bh_proc_stop(NULL, 0, 0, NULL), -EINVAL);
  ASSERT_RC(bh_proc_kill(NULL, SIGTERM), -EINVAL);
  bh_proc_close(NULL);
  ASSERT_FD_COUNT(fds0);
  return 0;
}

TEST_IMPL(proc_stop_kill_ladder) {
  int fds0 = bh_test_fd_count();
  bh_proc *p;
  int chan, st = -1;
  spawn_sh("trap '' TERM; echo ready; exec sleep 30", &p, &chan);
  pid_t pid = bh_proc_pid(p);
  wait_output(p, "ready"); /* the trap is set */
  int64_t start = bh_now_ns();
  ASSERT_OK(bh_proc_stop(p, 100, 200, &st));
  int64_t ms = (bh_now_ns() - start) / 1000000;
  ASSERT(WIFSIGNALED(st));
  ASSERT_EQ(WTERMSIG(st), SIGKILL);
  ASSERT_GE(ms, 300); /* grace + term, at least */
  assert_reaped(pid);
  /* Stopping again is a no-op with the same status. */
  st = -1;
  ASSERT_OK(bh_proc_stop(p, 100, 200, &st));
  ASSERT_EQ(WTERMSIG(st), SIGKILL);
  close(chan);
  bh_proc_close(p);
  ASSERT_FD_COUNT(fds0);
  return 0;
}

/* A process's state letter from /proc/<pid>/stat, or 0 when it is gone. */
static char proc_state(pid_t pid) {
  char path[64], buf[512];
  snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  ssize_t n = read(fd, buf, sizeof buf - 1);
  close(fd);
  if (n <= 0) return 0;
  buf[n] = 0;
  char *rp = strrchr(buf, ')');
  return rp && rp[1] == ' ' ? rp[2] : 0;
}

/* Teardown takes the worker's whole process group: a helper it forked
 * (which would hold the channel's end) does not outlive it.  Both the stop
 * ladder and close. */
TEST_IMPL(proc_teardown_takes_the_process_group) {
  for (int how = 0; how < 2; how++) {
    bh_proc *p;
    int chan, st;
    spawn_sh("trap '' TERM; sleep 30 & echo helper=$!; exec sleep 30", &p, &chan);
    wait_output(p, "helper=");
    char out[BH_TEST_TAIL];
    bh_proc_output_tail(p, out, sizeof out);
    pid_t helper = (pid_t)atoi(strstr(out, "helper=") + 7);
    ASSERT_GT(helper, 0);
    ASSERT(proc_state(helper) != 0 && proc_state(helper) != 'Z');
    if (how == 0) ASSERT_OK(bh_proc_stop(p, 0, 200, &st));
    bh_proc_close(p);
    close(chan);
    char state = 0;
    for (int i = 0; i < 500 && (state = proc_state(helper)) != 0 && state != 'Z'; i++)
      bh_test_sleep_ms(10);
    if (state != 0 && state != 'Z')
      FAIL("%s left the worker's helper %d running (state %c)", how ? "close" : "stop",
           (int)helper, state);
  }
  return 0;
}

TEST_IMPL(proc_stop_cooperative) {
  bh_proc *p;
  int chan, st = -1;
  /* Exits on its own within the grace period: its own status. */
  spawn_sh("sleep 0.05; exit 4", &p, &chan);
  pid_t pid = bh_proc_pid(p);
  int64_t start = bh_test_now_ms();
  ASSERT_OK(bh_proc_stop(p, 5000, 5000, &st));
  ASSERT_LT(bh_test_now_ms() - start, 4000);
  ASSERT(WIFEXITED(st));
  ASSERT_EQ(WEXITSTATUS(st), 4);
  assert_reaped(pid);
  close(chan);
  bh_proc_close(p);
  /* Exits on SIGTERM: SIGKILL never needed. */
  spawn_sh("exec sleep 30", &p, &chan);
  pid = bh_proc_pid(p);
  start = bh_test_now_ms();
  ASSERT_OK(bh_proc_stop(p, 50, 5000, &st));
  int64_t ms = bh_test_now_ms() - start;
  ASSERT(WIFSIGNALED(st));
  ASSERT_EQ(WTERMSIG(st), SIGTERM);
  ASSERT_GE(ms, 50);
  ASSERT_LT(ms, 4000);
  assert_reaped(pid);
  close(chan);
  bh_proc_close(p);
  return 0;
}

TEST_IMPL(proc_wait_timeout_and_pidfd) {
  bh_proc *p;
  int chan, st;
  spawn_sh("exec sleep 30", &p, &chan);
  int pidfd = bh_proc_pidfd(p);
  ASSERT_GT(pidfd, 2);
  ASSERT(fcntl(pidfd, F_GETFD) & FD_CLOEXEC);
  int64_t start = bh_now_ns();
  ASSERT_RC(bh_proc_wait(p, 50, &st), -ETIMEDOUT);
  ASSERT_GE(bh_now_ns() - start, 50 * 1000000);
  struct pollfd pf = {pidfd, POLLIN, 0};
  ASSERT_EQ(poll(&pf, 1, 0), 0);
  ASSERT_OK(bh_proc_kill(p, SIGKILL));
  ASSERT_EQ(poll(&pf, 1, 5000), 1); /* readable once the child is dead */
  ASSERT_OK(bh_proc_wait(p, 5000, &st));
  ASSERT(WIFSIGNALED(st));
  ASSERT_EQ(WTERMSIG(st), SIGKILL);
  close(chan);
  bh_proc_close(p);
  return 0;
}

/*
 * Regression test, bug fixed in (src/core/supervisor.c bh_proc_wait): with a pidfd and
 * timeout_ms == 0 the poll is skipped and waitpid runs without WNOHANG
 * (`p->pidfd >= 0 || timeout_ms < 0 ? 0 : WNOHANG`), so a zero timeout
 * blocks until the child exits.  bh_proc_stop(p, 0, ...) inherits it: the
 * ladder never reaches SIGTERM for a child that does not exit by itself.
 */
TEST_IMPL(proc_wait_zero_timeout) {
  bh_proc *p;
  int chan, st;
  spawn_sh("exec sleep 2", &p, &chan);
  int64_t start = bh_test_now_ms();
  int rc = bh_proc_wait(p, 0, &st);
  int64_t ms = bh_test_now_ms() - start;
  if (rc == 0) FAIL("bh_proc_wait(p, 0) blocked %ld ms until the child exited", (long)ms);
  ASSERT_RC(rc, -ETIMEDOUT);
  ASSERT_LT(ms, 1000);
  /* grace 0: SIGTERM at once */
  start = bh_test_now_ms();
  ASSERT_OK(bh_proc_stop(p, 0, 5000, &st));
  ms = bh_test_now_ms() - start;
  ASSERT(WIFSIGNALED(st));
  ASSERT_EQ(WTERMSIG(st), SIGTERM);
  ASSERT_LT(ms, 1000);
  close(chan);
  bh_proc_close(p);
  return 0;
}

TEST_IMPL(proc_close_kills_and_reaps) {
  int fds0 = bh_test_fd_count();
  bh_proc *p;
  int chan;
  spawn_sh("echo started; exec sleep 30", &p, &chan);
  pid_t pid = bh_proc_pid(p);
  wait_output(p, "started");
  int64_t start = bh_test_now_ms();
  bh_proc_close(p);
  ASSERT_LT(bh_test_now_ms() - start, 2000);
  assert_reaped(pid);
  close(chan);
  ASSERT_FD_COUNT(fds0);
  return 0;
}

TEST_IMPL(proc_cwd) {
  char tmpl[] = "/tmp/bh-test-cwd-XXXXXX", real[PATH_MAX];
  ASSERT_NOT_NULL(mkdtemp(tmpl));
  ASSERT_NOT_NULL(realpath(tmpl, real));
  bh_proc *p;
  int chan, st;
  ASSERT_OK(spawn_sh_env("pwd; pwd -P", env_path, real, -1, NULL, &p, &chan));
  ASSERT_OK(bh_proc_wait(p, 10000, &st));
  ASSERT_EQ(WEXITSTATUS(st), 0);
  char out[2 * PATH_MAX + 8], want[2 * PATH_MAX + 8];
  bh_proc_output_tail(p, out, sizeof out);
  snprintf(want, sizeof want, "%s\n%s\n", real, real);
  ASSERT_STR_EQ(out, want);
  close(chan);
  bh_proc_close(p);
  /* Without cwd, the child starts where we are. */
  char here[PATH_MAX];
  ASSERT_NOT_NULL(getcwd(here, sizeof here));
  ASSERT_OK(spawn_sh_env("pwd -P", env_path, NULL, -1, NULL, &p, &chan));
  ASSERT_OK(bh_proc_wait(p, 10000, &st));
  bh_proc_output_tail(p, out, sizeof out);
  ASSERT_NOT_NULL(realpath(here, real));
  snprintf(want, sizeof want, "%s\n", real);
  ASSERT_STR_EQ(out, want);
  close(chan);
  bh_proc_close(p);
  ASSERT_SYS(rmdir(tmpl));
  return 0;
}

TEST_IMPL(proc_stderr_sink_prefix) {
  int fds0 = bh_test_fd_count();
  int sink[2];
  ASSERT_SYS(pipe2(sink, O_CLOEXEC | O_NONBLOCK));
  bh_proc *p;
  int chan, st;
  ASSERT_OK(spawn_sh_env("echo one; echo two >&2; printf 'three\\n'; sleep 0.05; "
                         "printf 'fo'; sleep 0.05; printf 'ur\\n\\nsix'",
                         env_path, NULL, sink[1], "[w] ", &p, &chan));
  ASSERT_OK(bh_proc_wait(p, 10000, &st));
  ASSERT_EQ(WEXITSTATUS(st), 0);
  wait_output(p, "six");
  char tail[256];
  bh_proc_output_tail(p, tail, sizeof tail);
  ASSERT_STR_EQ(tail, "one\ntwo\nthree\nfour\n\nsix"); /* the tail is unprefixed */
  close(chan);
  bh_proc_close(p); /* joins the drain thread: all copied */
  char out[512];
  ssize_t n = read(sink[0], out, sizeof out - 1);
  ASSERT_GT(n, 0);
  out[n] = 0;
  /* One prefix per line, a line split across reads included, an empty
   * line included, and the unterminated last one. */
  ASSERT_STR_EQ(out, "[w] one\n[w] two\n[w] three\n[w] four\n[w] \n[w] six");
  close(sink[0]);
  close(sink[1]);
  ASSERT_FD_COUNT(fds0);
  return 0;
}

/*
 * Regression test, bug fixed in (src/core/supervisor.c bh_proc_spawn): only the child's ends
 * (sv[1], outp[1]) are lifted above the stdio numbers.  In a host whose
 * stdin is closed (a daemon), socketpair() hands back fd 0 as the host end,
 * bh_proc_spawn returns *chan_fd == 0, and bh_channel_open refuses any fd
 * <= 2 with -EINVAL (and, never closing it, leaks it): such a host cannot
 * talk to any worker.
 */
TEST_IMPL(proc_spawn_with_stdin_closed) {
  close(0);
  bh_proc *p;
  int chan, st;
  ASSERT_OK(spawn_sh_env("exit 0", env_path, NULL, -1, NULL, &p, &chan));
  bh_channel_opts o = {.peer_uid = getuid(), .peer_pid = bh_proc_pid(p)};
  bh_channel *c;
  int rc = bh_channel_open(&c, chan, &o);
  if (rc) FAIL("bh_channel_open(chan_fd %d) from bh_proc_spawn: %s", chan, bh_test_errname(rc));
  ASSERT_OK(bh_proc_wait(p, 10000, &st));
  bh_channel_close(c);
  bh_proc_close(p);
  return 0;
}
