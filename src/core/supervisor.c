/*
 * supervisor.c -- spawn, watch and stop one worker process.
 *
 * bh_proc_spawn makes the channel's socketpair first (so there is no
 * listening address to find or steal), then posix_spawns the interpreter
 * with: fd 0 /dev/null, fds 1 and 2 a pipe, fd 3 the child's end of the
 * socketpair, default signal dispositions, an empty signal mask, its own
 * process group (a terminal's Ctrl-C reaches the host, which decides; the
 * stop ladder and close signal that whole group, not just the worker), and
 * exactly the environment the caller built.  Every other fd bulkhead holds
 * is close-on-exec, and the host's own inheritable fds (a ComfyUI extension's
 * pipe, a library's log file) are closed in the child after the dup2s:
 * closefrom(4) as a spawn action where the C library has one (glibc 2.34),
 * else one close action per inheritable fd found in /proc/self/fd.  So the
 * child inherits exactly fds 0-3.
 *
 * bh_proc_fork_via gets the same layout from a zygote (a started
 * interpreter with the worker's modules imported, worker/zygote.py): the
 * host makes the three ends and hands them over with SCM_RIGHTS, the
 * zygote forks, the child sets them up as the spawn would and leads its
 * own group.  Not being the child's parent, the host learns its end from
 * the zygote: a per-child report socket carries the wait status once the
 * child exits, and the zygote reaps the zombie only when the host answers
 * -- so until then neither the pid nor the group can be reused, and the
 * group kill before the reap holds as for a spawned child.  A zygote that
 * dies first leaves its children to init: the host then waits on the
 * pidfd, signals the leader alone through it, and has no status; once
 * the leader ended, what is left of its group goes member by member,
 * each through a pidfd (bh__kill_orphan_group): no zombie keeps the
 * group's number, so kill(-pid) could reach another's.
 *
 * A drain thread copies the child's output to a sink fd (the host's
 * stderr), prefixing each line, and keeps the last BH__TAIL bytes so an
 * error can quote what the worker said before it died.  Death is seen
 * through a pidfd (and, by the channel, as EOF); the child is reaped
 * exactly once, by bh_proc_wait.
 */
#include "internal.h"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <time.h>

#define BH__TAIL 8192

struct bh_proc {
  pid_t pid;
  int pidfd;
  int reaped;
  int status;
  int out_fd;  /* read end of the child's stdout/stderr pipe */
  int stop_fd; /* pipe: written to stop the drain thread */
  int stop_wr;
  int sink;
  int report_fd; /* forked by a zygote (bh_proc_fork_via): its report socket, else -1 */
  int orphaned;  /* the zygote went before reporting: the leader is signalled by pidfd alone */
  unsigned long long start_ticks; /* forked: its start time (/proc stat), for its group once orphaned */
  int64_t report_due; /* forked: when its report is overdue (the pidfd said it ended), else 0 */
  char prefix[64];
  pthread_t drain;
  int drain_started;
  pthread_mutex_t mu; /* guards tail and drained */
  pthread_cond_t cv;
  int drained; /* the pipe reached EOF */
  char tail[BH__TAIL];
  size_t tail_len;
};

static void bh__tail_add(bh_proc *p, const char *s, size_t n) {
  if (n > BH__TAIL) {
    s += n - BH__TAIL;
    n = BH__TAIL;
  }
  pthread_mutex_lock(&p->mu);
  size_t keep = p->tail_len + n > BH__TAIL ? BH__TAIL - n : p->tail_len;
  memmove(p->tail, p->tail + p->tail_len - keep, keep);
  memcpy(p->tail + keep, s, n);
  p->tail_len = keep + n;
  pthread_mutex_unlock(&p->mu);
}

static void bh__write_all(int fd, const char *s, size_t n) {
  while (n) {
    ssize_t w = write(fd, s, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return;
    s += w;
    n -= (size_t)w;
  }
}

static void *bh__drain_main(void *arg) {
  bh_proc *p = arg;
  char buf[4096];
  int at_line_start = 1;
  size_t plen = strlen(p->prefix);
  for (;;) {
    struct pollfd pf[2] = {{p->out_fd, POLLIN, 0}, {p->stop_fd, POLLIN, 0}};
    int r = poll(pf, 2, -1);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) break;
    int stopping = pf[1].revents != 0;
    /* On stop, take what is already in the pipe but do not wait for more. */
    ssize_t n = (pf[0].revents || stopping) ? read(p->out_fd, buf, sizeof buf) : 0;
    if (n < 0 && errno == EINTR) continue;
    if (n > 0) {
      bh__tail_add(p, buf, (size_t)n);
      if (p->sink >= 0) {
        size_t i = 0;
        while (i < (size_t)n) {
          if (at_line_start && plen) bh__write_all(p->sink, p->prefix, plen);
          char *nl = memchr(buf + i, '\n', (size_t)n - i);
          size_t end = nl ? (size_t)(nl - buf) + 1 : (size_t)n;
          bh__write_all(p->sink, buf + i, end - i);
          at_line_start = nl != NULL;
          i = end;
        }
      }
      continue;
    }
    if (n < 0 && errno == EAGAIN && !stopping) continue;
    if (n == 0 || stopping || n < 0) break;
  }
  pthread_mutex_lock(&p->mu);
  p->drained = 1;
  pthread_cond_broadcast(&p->cv);
  pthread_mutex_unlock(&p->mu);
  return NULL;
}

/* Moves fd above the low numbers the child's layout uses. */
#ifndef BH_HAS_ADDCLOSEFROM_NP
/* The fallback of closefrom(4): a close action for every fd >= 4 without
 * FD_CLOEXEC open now.  (An fd another thread opens between this walk and
 * the spawn is not seen: the C library's closefrom has no such window.) */
static int bh__add_close_inheritable(posix_spawn_file_actions_t *fa) {
  DIR *d = opendir("/proc/self/fd");
  if (!d) return errno;
  int self = dirfd(d), rc = 0;
  struct dirent *e;
  while (rc == 0 && (e = readdir(d)) != NULL) {
    char *end;
    long fd = strtol(e->d_name, &end, 10);
    if (*end || end == e->d_name || fd < 4 || fd == self) continue;
    int flags = fcntl((int)fd, F_GETFD);
    if (flags >= 0 && !(flags & FD_CLOEXEC)) rc = posix_spawn_file_actions_addclose(fa, (int)fd);
  }
  closedir(d);
  return rc;
}
#endif

static int bh__lift(int *fd) {
  if (*fd > 3) return 0;
  int n = fcntl(*fd, F_DUPFD_CLOEXEC, 10);
  if (n < 0) return -errno;
  close(*fd);
  *fd = n;
  return 0;
}

static int bh__pidfd_open(pid_t pid) {
#ifdef SYS_pidfd_open
  return (int)syscall(SYS_pidfd_open, pid, 0);
#else
  (void)pid;
  errno = ENOSYS;
  return -1;
#endif
}

/* A bh_proc with no process yet: every fd -1, output to sink after prefix. */
static bh_proc *bh__proc_new(int sink, const char *prefix) {
  bh_proc *p = calloc(1, sizeof *p);
  if (!p) return NULL;
  p->pidfd = p->out_fd = p->stop_fd = p->stop_wr = p->report_fd = -1;
  p->sink = sink;
  if (prefix) snprintf(p->prefix, sizeof p->prefix, "%s", prefix);
  pthread_mutex_init(&p->mu, NULL);
  pthread_cond_init(&p->cv, NULL);
  return p;
}

static void bh__proc_free(bh_proc *p) {
  pthread_cond_destroy(&p->cv);
  pthread_mutex_destroy(&p->mu);
  free(p);
}

/* p->pid started: its pidfd (none: waits fall back to waitpid), the read
 * end of its output pipe and the drain thread's stop pipe taken over (set
 * to -1 in the caller's arrays), the drain thread started. */
static void bh__proc_run(bh_proc *p, int outp[2], int stopp[2]) {
  p->pidfd = bh__pidfd_open(p->pid);
  if (p->pidfd >= 0 && bh__lift(&p->pidfd)) {
    close(p->pidfd);
    p->pidfd = -1;
  }
  p->out_fd = outp[0];
  outp[0] = -1;
  fcntl(p->out_fd, F_SETFL, fcntl(p->out_fd, F_GETFL) | O_NONBLOCK);
  p->stop_fd = stopp[0];
  p->stop_wr = stopp[1];
  stopp[0] = stopp[1] = -1;
  if (pthread_create(&p->drain, NULL, bh__drain_main, p) == 0) p->drain_started = 1;
}

struct bh__spawn_call {
  pid_t *pid;
  const bh_spawn_opts *o;
  const posix_spawn_file_actions_t *fa;
  const posix_spawnattr_t *attr;
};

/* posix_spawn's error number (0 spawned). */
static int bh__spawn_call_run(void *arg) {
  struct bh__spawn_call *c = arg;
  return posix_spawn(c->pid, c->o->interpreter, c->fa, c->attr, (char *const *)c->o->argv,
                     (char *const *)c->o->envp);
}

int bh_proc_spawn(const bh_spawn_opts *o, bh_proc **out, int *chan_fd) {
  int sv[2] = {-1, -1}, outp[2] = {-1, -1}, stopp[2] = {-1, -1};
  int rc, fa_init = 0, attr_init = 0;
  posix_spawn_file_actions_t fa;
  posix_spawnattr_t attr;
  bh_proc *p = NULL;
  if (!o || !o->interpreter || !o->argv || !o->argv[0] || !o->envp || !out || !chan_fd)
    return -EINVAL;
  if (!(p = bh__proc_new(o->stderr_sink, o->stderr_prefix))) return -ENOMEM;

  if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) < 0 ||
      pipe2(outp, O_CLOEXEC) < 0 || pipe2(stopp, O_CLOEXEC) < 0) {
    rc = -errno;
    goto err;
  }
  /* Every end lives above the fds the child layout uses, and the host's
   * ends above stdio too (a daemon host may have closed fd 0). */
  if ((rc = bh__lift(&sv[0])) || (rc = bh__lift(&sv[1])) || (rc = bh__lift(&outp[0])) ||
      (rc = bh__lift(&outp[1])) || (rc = bh__lift(&stopp[0])) || (rc = bh__lift(&stopp[1])))
    goto err;

  if ((rc = posix_spawn_file_actions_init(&fa))) goto err_rc;
  fa_init = 1;
  if ((rc = posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0)) ||
      (rc = posix_spawn_file_actions_adddup2(&fa, outp[1], 1)) ||
      (rc = posix_spawn_file_actions_adddup2(&fa, outp[1], 2)) ||
      (rc = posix_spawn_file_actions_adddup2(&fa, sv[1], 3)))
    goto err_rc;
#ifdef BH_HAS_ADDCLOSEFROM_NP
  if ((rc = posix_spawn_file_actions_addclosefrom_np(&fa, 4))) goto err_rc;
#else
  if ((rc = bh__add_close_inheritable(&fa))) goto err_rc;
#endif
  if (o->cwd) {
#ifdef BH_HAS_ADDCHDIR_NP
    if ((rc = posix_spawn_file_actions_addchdir_np(&fa, o->cwd))) goto err_rc;
#else
    rc = ENOSYS;
    goto err_rc;
#endif
  }
  if ((rc = posix_spawnattr_init(&attr))) goto err_rc;
  attr_init = 1;
  sigset_t none, all;
  sigemptyset(&none);
  sigfillset(&all);
  sigdelset(&all, SIGKILL);
  sigdelset(&all, SIGSTOP);
  if ((rc = posix_spawnattr_setsigmask(&attr, &none)) ||
      (rc = posix_spawnattr_setsigdefault(&attr, &all)) ||
      (rc = posix_spawnattr_setpgroup(&attr, 0)) ||
      (rc = posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF |
                                                POSIX_SPAWN_SETPGROUP)))
    goto err_rc;
  struct bh__spawn_call sc = {&p->pid, o, &fa, &attr};
  if (o->sandbox) {
    /* On a thread that restricts itself first: the child execs in the
     * sandbox, the host's threads stay free (sandbox.c). */
    char why[256];
    if ((rc = bh__sandbox_run(o->sandbox, bh__spawn_call_run, &sc, why, sizeof why)) < 0) {
      rc = -rc;
      goto err_rc;
    }
  } else {
    rc = bh__spawn_call_run(&sc);
  }
  if (rc) goto err_rc;

  bh__close(sv[1]);
  sv[1] = -1;
  bh__close(outp[1]);
  outp[1] = -1;
  bh__proc_run(p, outp, stopp);
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&attr);
  *chan_fd = sv[0];
  *out = p;
  return 0;

err_rc:
  rc = -rc;
err:
  if (fa_init) posix_spawn_file_actions_destroy(&fa);
  if (attr_init) posix_spawnattr_destroy(&attr);
  for (int i = 0; i < 2; i++) {
    if (sv[i] > 2) bh__close(sv[i]);
    if (outp[i] > 2) bh__close(outp[i]);
    if (stopp[i] > 2) bh__close(stopp[i]);
  }
  bh__proc_free(p);
  return rc;
}

/* A deadline timeout_ms from now (<0: none, -1), and the ms left to it
 * for poll (-1: none; 0 once passed). */
static int64_t bh__deadline(int timeout_ms) {
  return timeout_ms < 0 ? -1 : bh_now_ns() + (int64_t)timeout_ms * 1000000;
}

static int bh__left_ms(int64_t deadline) {
  if (deadline < 0) return -1;
  int64_t ns = deadline - bh_now_ns();
  return ns <= 0 ? 0 : (int)((ns + 999999) / 1000000);
}

static int bh__pidfd_signal(int pidfd, int sig) {
#ifdef SYS_pidfd_send_signal
  return syscall(SYS_pidfd_send_signal, pidfd, sig, NULL, 0) < 0 ? -errno : 0;
#else
  (void)pidfd;
  (void)sig;
  return -ENOSYS;
#endif
}

/* Sends buf with three fds on the zygote's socket and reads its answer:
 * an int32 (the child's pid, or -errno) and what it says of an error. */
static int bh__zygote_ask(const bh_fork_opts *o, const int fds[3], pid_t *pid, char *why, size_t why_n) {
  union {
    char buf[CMSG_SPACE(3 * sizeof(int))];
    struct cmsghdr align;
  } u;
  memset(&u, 0, sizeof u);
  struct iovec iov = {(void *)o->request, o->request_len};
  struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf, .msg_controllen = sizeof u.buf};
  struct cmsghdr *c = CMSG_FIRSTHDR(&m);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(3 * sizeof(int));
  memcpy(CMSG_DATA(c), fds, 3 * sizeof(int));
  ssize_t n;
  do n = sendmsg(o->zygote_fd, &m, MSG_NOSIGNAL);
  while (n < 0 && errno == EINTR);
  if (n < 0) return -errno;
  int64_t deadline = bh__deadline(o->timeout_ms > 0 ? o->timeout_ms : 10000);
  for (;;) {
    struct pollfd pf = {o->zygote_fd, POLLIN, 0};
    int r = poll(&pf, 1, bh__left_ms(deadline));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return -errno;
    if (r == 0) return -ETIMEDOUT;
    break;
  }
  char reply[4 + 512];
  do n = recv(o->zygote_fd, reply, sizeof reply, 0);
  while (n < 0 && errno == EINTR);
  if (n < 0) return -errno;
  if (n < 4) return -EPIPE; /* the zygote went (EOF) or spoke nonsense */
  int32_t v;
  memcpy(&v, reply, 4);
  size_t k = (size_t)n - 4 < why_n - 1 ? (size_t)n - 4 : why_n - 1;
  memcpy(why, reply + 4, k);
  why[k] = 0;
  if (v <= 0) return v < 0 && v > -4096 ? v : -EPROTO;
  *pid = (pid_t)v;
  return 0;
}

/* A process's state letter, process group and start time (clock ticks
 * since boot) from /proc/<pid>/stat; -errno where it is gone.  Any output
 * may be NULL. */
static int bh__proc_stat(pid_t pid, char *state, pid_t *pgrp, unsigned long long *start) {
  char path[32], buf[1024];
  snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -errno;
  ssize_t n = read(fd, buf, sizeof buf - 1);
  bh__close(fd);
  if (n <= 0) return -ESRCH;
  buf[n] = 0;
  char *at = strrchr(buf, ')'); /* the name may hold anything, ')' too */
  char st;
  int pg;
  unsigned long long t;
  /* state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt
   * utime stime cutime cstime priority nice threads itrealvalue starttime */
  if (!at || sscanf(at + 1, " %c %*d %d %*d %*d %*d %*u %*u %*u %*u %*u %*u %*u %*d %*d %*d %*d %*d %*d %llu",
                    &st, &pg, &t) != 3)
    return -EPROTO;
  if (state) *state = st;
  if (pgrp) *pgrp = pg;
  if (start) *start = t;
  return 0;
}

/* The group of a zygote's child that ended after its zygote: init reaped
 * it at once, so no zombie holds the group's number and kill(-pid) could
 * reach a group that reused it.  Its members -- what the worker forked, a
 * pack's helpers -- are found instead (in its group, started since it
 * did, not zombies), each pinned by a pidfd and checked again through it
 * (the same start time: the same process) before it is killed; passes
 * repeat while any is found (one may fork meanwhile).  A member keeps the
 * group's number from reuse while it lives; should the leader's pid name
 * another process by now (another start time), every member went before
 * and there is nothing to kill.  (The one case this cannot tell: a group
 * another process made with that number, whose leader exited too, all in
 * the moment since the worker ended -- a full turn of pid_max.) */
static void bh__kill_orphan_group(const bh_proc *p) {
  for (int pass = 0; pass < 64; pass++) {
    unsigned long long t;
    if (bh__proc_stat(p->pid, NULL, NULL, &t) == 0 && t != p->start_ticks) return; /* reused */
    DIR *d = opendir("/proc");
    if (!d) return;
    int found = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
      char *end;
      long q = strtol(e->d_name, &end, 10);
      char st;
      pid_t pg;
      if (*end || end == e->d_name || q <= 0 || q == p->pid) continue;
      if (bh__proc_stat((pid_t)q, &st, &pg, &t) || pg != p->pid || st == 'Z' || t < p->start_ticks)
        continue;
      int fd = bh__pidfd_open((pid_t)q);
      if (fd < 0) continue;
      unsigned long long again;
      if (bh__proc_stat((pid_t)q, &st, &pg, &again) == 0 && again == t && pg == p->pid && st != 'Z' &&
          bh__pidfd_signal(fd, SIGKILL) == 0)
        found++;
      bh__close(fd);
    }
    closedir(d);
    if (!found) return;
  }
}

int bh_proc_fork_via(const bh_fork_opts *o, bh_proc **out, int *chan_fd, char *why, size_t why_n) {
  int sv[2] = {-1, -1}, outp[2] = {-1, -1}, rep[2] = {-1, -1}, stopp[2] = {-1, -1};
  int rc;
  bh_proc *p = NULL;
  if (!o || o->zygote_fd < 0 || !o->request || !out || !chan_fd || !why || why_n == 0) return -EINVAL;
  why[0] = 0;
  if (!(p = bh__proc_new(o->stderr_sink, o->stderr_prefix))) return -ENOMEM;
  if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) < 0 ||
      socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, rep) < 0 || pipe2(outp, O_CLOEXEC) < 0 ||
      pipe2(stopp, O_CLOEXEC) < 0) {
    rc = -errno;
    goto err;
  }
  if ((rc = bh__lift(&sv[0])) || (rc = bh__lift(&rep[0])) || (rc = bh__lift(&outp[0])) ||
      (rc = bh__lift(&stopp[0])) || (rc = bh__lift(&stopp[1])))
    goto err;
  int give[3] = {sv[1], outp[1], rep[1]};
  pid_t pid = 0;
  rc = bh__zygote_ask(o, give, &pid, why, why_n);
  /* The zygote holds its own copies now (or never will): ours go. */
  bh__close(sv[1]);
  bh__close(outp[1]);
  bh__close(rep[1]);
  sv[1] = outp[1] = rep[1] = -1;
  if (rc) goto err;
  /* The child cannot be reaped before the host answers its report, so
   * the pid names it still. */
  p->pid = pid;
  (void)bh__proc_stat(pid, NULL, NULL, &p->start_ticks);
  p->report_fd = rep[0];
  rep[0] = -1;
  bh__proc_run(p, outp, stopp);
  *chan_fd = sv[0];
  *out = p;
  return 0;
err:
  for (int i = 0; i < 2; i++) {
    if (sv[i] >= 0) bh__close(sv[i]);
    if (outp[i] >= 0) bh__close(outp[i]);
    if (rep[i] >= 0) bh__close(rep[i]);
    if (stopp[i] >= 0) bh__close(stopp[i]);
  }
  bh__proc_free(p);
  return rc;
}

/* A zygote's child: waits for its report (the wait status, the zombie kept
 * until this answer), kills what is left of its group and lets the zygote
 * reap it.  A zygote gone first: the pidfd tells the end, with no status.
 * The child's pidfd is watched beside the report: a zygote reports an
 * ended child within microseconds, so one that has not BH__REPORT_GRACE_MS
 * after the pidfd said the child ended is stopped (SIGSTOP, a debugger) or
 * hung, and the wait ends without it (status BH_STATUS_UNREPORTED; the
 * zombie still holds the pid, so the group kill is safe).  Its late report
 * or its EOF is never read: the zygote reaps the child once this side's
 * report socket closes (bh_proc_close). */
#define BH__REPORT_GRACE_MS 3000

static int bh__wait_forked(bh_proc *p, int timeout_ms) {
  int64_t deadline = bh__deadline(timeout_ms);
  for (;;) {
    int left = bh__left_ms(deadline);
    struct pollfd pf[2] = {{p->orphaned ? p->pidfd : p->report_fd, POLLIN, 0},
                           {p->orphaned || p->report_due ? -1 : p->pidfd, POLLIN, 0}};
    if (pf[0].fd < 0) return -ESRCH; /* orphaned with no pidfd: nothing can tell */
    if (p->report_due && !p->orphaned) {
      int grace = bh__left_ms(p->report_due);
      if (grace == 0) {
        kill(-p->pid, SIGKILL);
        p->status = BH_STATUS_UNREPORTED;
        p->reaped = 1;
        return 0;
      }
      if (left < 0 || grace < left) left = grace;
    }
    int r = poll(pf, 2, left);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return -errno;
    if (r == 0) {
      if (p->report_due && !p->orphaned && bh__left_ms(p->report_due) == 0) continue;
      return -ETIMEDOUT;
    }
    if (!pf[0].revents) { /* the child ended; its report is due (kept: a wait may be a poll) */
      p->report_due = bh__deadline(BH__REPORT_GRACE_MS);
      continue;
    }
    if (p->orphaned) {
      bh__kill_orphan_group(p);
      p->status = -1;
      p->reaped = 1;
      return 0;
    }
    int32_t st;
    ssize_t n;
    do n = recv(p->report_fd, &st, sizeof st, MSG_WAITALL);
    while (n < 0 && errno == EINTR);
    if (n == (ssize_t)sizeof st) {
      kill(-p->pid, SIGKILL);
      bh__write_all(p->report_fd, "r", 1);
      p->status = st;
      p->reaped = 1;
      return 0;
    }
    p->orphaned = 1; /* EOF: the zygote is gone; init has the child now */
  }
}

pid_t bh_proc_pid(const bh_proc *p) { return p->pid; }
int bh_proc_pidfd(const bh_proc *p) { return p->pidfd; }

int bh_proc_wait(bh_proc *p, int timeout_ms, int *status) {
  if (!p) return -EINVAL;
  if (!p->reaped && p->report_fd >= 0) {
    int rc = bh__wait_forked(p, timeout_ms);
    if (rc) return rc;
  }
  if (!p->reaped) {
    if (p->pidfd >= 0 && timeout_ms != 0) {
      int64_t deadline = bh__deadline(timeout_ms);
      for (;;) {
        int left = bh__left_ms(deadline);
        struct pollfd pf = {p->pidfd, POLLIN, 0};
        int r = poll(&pf, 1, left);
        if (r < 0 && errno == EINTR) continue;
        if (r == 0) return -ETIMEDOUT;
        break;
      }
    }
    int st = 0;
    pid_t r;
    siginfo_t si;
    int flags = timeout_ms == 0 || (p->pidfd < 0 && timeout_ms > 0) ? WNOHANG : 0;
    /* Seen exited but not reaped first: the zombie still holds its pid, so
     * the group it leads (its own, from the spawn) cannot have been reused,
     * and what it forked -- a pack's helper -- is killed with it, however
     * the worker ended (its death, a hang's or an interrupt's SIGKILL,
     * teardown).  Once reaped, nothing could name that group safely. */
    memset(&si, 0, sizeof si);
    do r = (pid_t)waitid(P_PID, (id_t)p->pid, &si, WEXITED | WNOWAIT | flags);
    while (r < 0 && errno == EINTR);
    if (r < 0) return -errno;
    if (si.si_pid == 0) return -ETIMEDOUT; /* WNOHANG: still running */
    kill(-p->pid, SIGKILL);
    do r = waitpid(p->pid, &st, 0);
    while (r < 0 && errno == EINTR);
    if (r < 0) return -errno;
    p->reaped = 1;
    p->status = st;
  }
  if (status) *status = p->status;
  return 0;
}

int bh_proc_kill(bh_proc *p, int sig) {
  if (!p) return -EINVAL;
  if (p->reaped) return -ESRCH;
  /* Not reaped yet, so the pid cannot have been reused (a zygote's
   * orphan: init may reap it any time, so through its pidfd). */
  if (p->orphaned) return p->pidfd >= 0 ? bh__pidfd_signal(p->pidfd, sig) : -ESRCH;
  return kill(p->pid, sig) < 0 ? -errno : 0;
}

/* Teardown's signal: the child's whole process group (its own, from the
 * spawn), so what the worker forked -- a pack's helper that may hold the
 * channel's end -- goes with it (and once the worker has exited, at any
 * end, bh_proc_wait kills what is left of the group before reaping it).  Not reaped yet, so neither the pid nor
 * the group it names can have been reused.  A worker that left its group
 * (setsid) is signalled alone. */
static int bh__kill_group(bh_proc *p, int sig) {
  if (p->reaped) return -ESRCH;
  if (p->orphaned) return bh_proc_kill(p, sig);
  if (kill(-p->pid, sig) == 0) return 0;
  return kill(p->pid, sig) < 0 ? -errno : 0;
}

int bh_proc_stop(bh_proc *p, int grace_ms, int term_ms, int *status) {
  if (!p) return -EINVAL;
  if (bh_proc_wait(p, grace_ms, status) == 0) return 0;
  bh__kill_group(p, SIGTERM);
  if (bh_proc_wait(p, term_ms, status) == 0) return 0;
  bh__kill_group(p, SIGKILL);
  return bh_proc_wait(p, -1, status);
}

size_t bh_proc_output_tail(bh_proc *p, char *buf, size_t n) {
  if (!p || !buf || n == 0) return 0;
  pthread_mutex_lock(&p->mu);
  if (p->reaped && p->drain_started) {
    /* The child is gone; give the drain thread a moment to read its last
     * words (a grandchild may still hold the pipe, so don't wait long). */
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += 200 * 1000000;
    if (ts.tv_nsec >= 1000000000) ts.tv_sec++, ts.tv_nsec -= 1000000000;
    while (!p->drained)
      if (pthread_cond_timedwait(&p->cv, &p->mu, &ts) == ETIMEDOUT) break;
  }
  size_t k = p->tail_len < n - 1 ? p->tail_len : n - 1;
  memcpy(buf, p->tail + p->tail_len - k, k);
  buf[k] = 0;
  pthread_mutex_unlock(&p->mu);
  return k;
}

void bh_proc_close(bh_proc *p) {
  if (!p) return;
  if (!p->reaped) {
    bh__kill_group(p, SIGKILL);
    bh_proc_wait(p, -1, NULL);
  }
  if (p->drain_started) {
    bh__write_all(p->stop_wr, "x", 1);
    pthread_join(p->drain, NULL);
  }
  if (p->pidfd >= 0) bh__close(p->pidfd);
  if (p->out_fd >= 0) bh__close(p->out_fd);
  if (p->stop_fd >= 0) bh__close(p->stop_fd);
  if (p->stop_wr >= 0) bh__close(p->stop_wr);
  if (p->report_fd >= 0) bh__close(p->report_fd);
  bh__proc_free(p);
}

static inline void bh__relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#else
  __asm__ __volatile__("" ::: "memory");
#endif
}

double bh_relax_ns(void) {
  enum { STEPS = 4096, RUNS = 5 };
  static int flag; /* libgomp's do_spin reads the word it waits on between steps */
  double best = 0;
  for (int r = 0; r < RUNS; r++) {
    int64_t t0 = bh_now_ns();
    for (int i = 0; i < STEPS; i++) {
      if (__atomic_load_n(&flag, __ATOMIC_RELAXED) != 0)
        break;
      bh__relax();
    }
    double ns = (double)(bh_now_ns() - t0) / STEPS;
    if (r == 0 || ns < best)
      best = ns;
  }
  return best;
}
