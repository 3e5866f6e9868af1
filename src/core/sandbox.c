/*
 * sandbox.c -- Landlock: what a pack's worker may touch, applied before
 * any of its code runs.
 *
 * Landlock (Linux 5.13+) lets any unprivileged process give up access for
 * itself and everything it later starts: a ruleset names the rights it
 * handles, rules grant some of them beneath paths (or on TCP ports), and
 * landlock_restrict_self puts the calling thread in a domain that no
 * child, thread made after, exec or setuid leaves.  Nothing else is
 * needed: no root, no helper binary, no user namespace.
 *
 * bh_sandbox_apply builds one ruleset from a bh_sandbox (read, write and
 * device paths, whether TCP is allowed) at the best ABI the kernel has,
 * and restricts the calling thread: handled are every filesystem right of
 * that ABI, TCP bind/connect where network is off (ABI 4), and the
 * signal and abstract-socket scopes (ABI 6: a sandboxed process can
 * signal, or connect to an abstract Unix socket of, only processes in its
 * own domain).  ptrace out of a domain is refused by Landlock at every
 * ABI.  A path that does not exist (or cannot be opened) is skipped: it
 * grants nothing, and a missing cache is not an error.
 *
 * A spawned worker is restricted between fork and exec without giving up
 * posix_spawn: bh__sandbox_run runs the spawn on a thread of its own that
 * restricts itself first, and a child inherits its creating thread's
 * credentials, so the child execs inside the domain while the host's other
 * threads stay as they were; the thread ends after the spawn.  A zygote's
 * child (worker/zygote.py) calls bh_sandbox_apply itself after the fork,
 * single-threaded, before it imports anything of the pack.
 *
 * The kernel's UAPI header may predate the ABI it runs (Debian 12's stops
 * at ABI 2), so the few newer names are defined here.
 */
#include "internal.h"

#include <fcntl.h>
#include <linux/landlock.h>
#include <stdio.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>

#ifndef LANDLOCK_ACCESS_FS_REFER
#define LANDLOCK_ACCESS_FS_REFER (1ULL << 13)
#endif
#ifndef LANDLOCK_ACCESS_FS_TRUNCATE
#define LANDLOCK_ACCESS_FS_TRUNCATE (1ULL << 14)
#endif
#define BH__FS_IOCTL_DEV (1ULL << 15)    /* ABI 5 */
#define BH__NET_BIND_TCP (1ULL << 0)     /* ABI 4 */
#define BH__NET_CONNECT_TCP (1ULL << 1)
#define BH__SCOPE_ABSTRACT_UNIX (1ULL << 0) /* ABI 6 */
#define BH__SCOPE_SIGNAL (1ULL << 1)

/* The ruleset's attribute as ABI 6 knows it; the size passed tells an
 * older kernel how much of it to read. */
struct bh__ruleset_attr {
  uint64_t handled_access_fs;
  uint64_t handled_access_net;
  uint64_t scoped;
};

struct bh__path_beneath {
  uint64_t allowed_access;
  int32_t parent_fd;
} __attribute__((packed));

#define BH__RULE_PATH_BENEATH 1

/* The rights that only make sense on a file (a rule on a file may grant
 * no other). */
#define BH__FILE_RIGHTS                                                                     \
  (LANDLOCK_ACCESS_FS_EXECUTE | LANDLOCK_ACCESS_FS_WRITE_FILE | LANDLOCK_ACCESS_FS_READ_FILE | \
   LANDLOCK_ACCESS_FS_TRUNCATE | BH__FS_IOCTL_DEV)
#define BH__READ_RIGHTS \
  (LANDLOCK_ACCESS_FS_EXECUTE | LANDLOCK_ACCESS_FS_READ_FILE | LANDLOCK_ACCESS_FS_READ_DIR)
#define BH__DEVICE_RIGHTS                                                                      \
  (LANDLOCK_ACCESS_FS_READ_FILE | LANDLOCK_ACCESS_FS_WRITE_FILE | LANDLOCK_ACCESS_FS_READ_DIR | \
   LANDLOCK_ACCESS_FS_TRUNCATE | BH__FS_IOCTL_DEV)

static long bh__ll_create(const struct bh__ruleset_attr *a, size_t size, uint32_t flags) {
#ifdef SYS_landlock_create_ruleset
  return syscall(SYS_landlock_create_ruleset, a, size, flags);
#else
  (void)a, (void)size, (void)flags;
  errno = ENOSYS;
  return -1;
#endif
}

int bh_sandbox_abi(void) {
  long v = bh__ll_create(NULL, 0, LANDLOCK_CREATE_RULESET_VERSION);
  if (v >= 0) return (int)v;
  return errno == ENOSYS || errno == EOPNOTSUPP ? 0 : -errno;
}

/* Every filesystem right the kernel at `abi` knows. */
static uint64_t bh__fs_rights(int abi) {
  uint64_t r = (LANDLOCK_ACCESS_FS_MAKE_BLOCK << 1) - 1; /* ABI 1: bits 0-12 */
  if (abi >= 2) r |= LANDLOCK_ACCESS_FS_REFER;
  if (abi >= 3) r |= LANDLOCK_ACCESS_FS_TRUNCATE;
  if (abi >= 5) r |= BH__FS_IOCTL_DEV;
  return r;
}

/* Grants `rights` (less what ruleset does not handle, and for a file what
 * a file cannot have) beneath each path.  A path that cannot be opened
 * is skipped; any other refusal fails the whole (a ruleset missing a rule
 * would refuse more than asked, never less, but the caller should know). */
static int bh__add_paths(int ruleset, const char *const *paths, uint64_t rights, uint64_t handled,
                         char *why, size_t why_n) {
  for (; paths && *paths; paths++) {
    int fd = open(*paths, O_PATH | O_CLOEXEC);
    if (fd < 0) continue;
    struct stat st;
    struct bh__path_beneath pb = {.allowed_access = rights & handled, .parent_fd = fd};
    if (fstat(fd, &st) == 0 && !S_ISDIR(st.st_mode)) pb.allowed_access &= BH__FILE_RIGHTS;
    long r = pb.allowed_access ? syscall(SYS_landlock_add_rule, ruleset, BH__RULE_PATH_BENEATH, &pb, 0) : 0;
    int err = errno;
    bh__close(fd);
    if (r < 0) {
      snprintf(why, why_n, "landlock_add_rule %s: %s", *paths, strerror(err));
      return -err;
    }
  }
  return 0;
}

int bh_sandbox_apply(const bh_sandbox *s, char *why, size_t why_n) {
  char scratch[8];
  if (!why || !why_n) why = scratch, why_n = sizeof scratch;
  why[0] = 0;
  if (!s) return -EINVAL;
  int abi = bh_sandbox_abi(), ruleset = -1, rc;
  if (abi <= 0) {
    snprintf(why, why_n, "this kernel has no Landlock (landlock_create_ruleset: %s)",
             abi == 0 ? "not supported or disabled" : strerror(-abi));
    return abi == 0 ? -ENOSYS : abi;
  }
  struct bh__ruleset_attr attr = {.handled_access_fs = bh__fs_rights(abi)};
  size_t size = sizeof(uint64_t);
  if (!s->network && abi >= 4) {
    attr.handled_access_net = BH__NET_BIND_TCP | BH__NET_CONNECT_TCP;
    size = 2 * sizeof(uint64_t);
  }
  if (abi >= 6) {
    attr.scoped = BH__SCOPE_ABSTRACT_UNIX | BH__SCOPE_SIGNAL;
    size = sizeof attr;
  }
  ruleset = (int)bh__ll_create(&attr, size, 0);
  if (ruleset < 0) {
    rc = -errno;
    snprintf(why, why_n, "landlock_create_ruleset: %s", strerror(errno));
    return rc;
  }
  uint64_t all = attr.handled_access_fs;
  if ((rc = bh__add_paths(ruleset, s->read, BH__READ_RIGHTS, all, why, why_n)) ||
      (rc = bh__add_paths(ruleset, s->write, all, all, why, why_n)) ||
      (rc = bh__add_paths(ruleset, s->devices, BH__DEVICE_RIGHTS, all, why, why_n)))
    goto out;
  /* Without no_new_privs an unprivileged process may not restrict itself
   * (a setuid program it execs would run under rules its owner never
   * chose).  It is per thread too, and inherited. */
  if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0) {
    rc = -errno;
    snprintf(why, why_n, "prctl(PR_SET_NO_NEW_PRIVS): %s", strerror(errno));
    goto out;
  }
  if (syscall(SYS_landlock_restrict_self, ruleset, 0) < 0) {
    rc = -errno;
    snprintf(why, why_n, "landlock_restrict_self: %s", strerror(errno));
    goto out;
  }
  rc = abi;
out:
  bh__close(ruleset);
  return rc;
}

struct bh__sandbox_call {
  const bh_sandbox *s;
  int (*fn)(void *);
  void *arg;
  int rc;
  char *why;
  size_t why_n;
};

static void *bh__sandbox_main(void *p) {
  struct bh__sandbox_call *c = p;
  c->rc = bh_sandbox_apply(c->s, c->why, c->why_n);
  if (c->rc > 0) c->rc = c->fn(c->arg);
  return NULL;
}

int bh__sandbox_run(const bh_sandbox *s, int (*fn)(void *), void *arg, char *why, size_t why_n) {
  struct bh__sandbox_call c = {s, fn, arg, 0, why, why_n};
  pthread_t t;
  int rc = pthread_create(&t, NULL, bh__sandbox_main, &c);
  if (rc) return -rc;
  pthread_join(t, NULL);
  return c.rc;
}
