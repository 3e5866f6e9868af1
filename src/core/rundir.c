/*
 * rundir.c -- private directories: the one check every place bulkhead
 * keeps per-user state in a shared directory goes through.
 *
 * /tmp and /dev/shm are writable by every local user, so a name there that
 * is derived from our uid (bulkhead-<uid>) can be made first by someone
 * else: a directory they own, or one that lets them in, would let them
 * replace what we put there (a package a worker imports, a socket, the
 * ledger).  bh_private_dir makes a directory 0700 where it is missing and
 * then checks what is there with lstat -- a directory, not a link, owned by
 * our euid, no group or other bits -- whoever made it.  Callers check every
 * component they create, from the first one below a directory that is not
 * ours to judge (/tmp, /dev/shm, $XDG_RUNTIME_DIR's parent).
 *
 * The default ledger lives in such a directory on /dev/shm, made once and
 * never removed (so the name cannot be squatted after each restart, only
 * before the first use after boot), or under $XDG_RUNTIME_DIR when that one
 * was taken: bh__ledger_home picks the path for the host, the workers and
 * the CLI alike.
 */
#include "internal.h"

#include <stdio.h>
#include <sys/stat.h>

int bh_private_dir(const char *path, int create) {
  struct stat st;
  if (!path || !*path) return -EINVAL;
  if (create && mkdir(path, 0700) < 0 && errno != EEXIST) return -errno;
  if (lstat(path, &st) < 0) return -errno;
  if (S_ISLNK(st.st_mode)) return -ELOOP;
  if (!S_ISDIR(st.st_mode)) return -ENOTDIR;
  if (st.st_uid != geteuid()) return -EPERM;
  if (st.st_mode & (S_IRWXG | S_IRWXO)) return -EACCES;
  return 0;
}

/* $XDG_RUNTIME_DIR when it is set and a private directory of ours (the
 * login manager made it 0700), else NULL. */
static const char *bh__xdg_runtime(void) {
  const char *run = getenv("XDG_RUNTIME_DIR");
  return run && run[0] == '/' && bh_private_dir(run, 0) == 0 ? run : NULL;
}

int bh__ledger_home(char *buf, size_t n, int create) {
  char dir[64];
  const char *env = getenv("BULKHEAD_LEDGER");
  int len, rc;
  if (env && *env) {
    len = snprintf(buf, n, "%s", env);
    return len < 0 || (size_t)len >= n ? -ENAMETOOLONG : len;
  }
  snprintf(dir, sizeof dir, "/dev/shm/bulkhead-%u", (unsigned)geteuid());
  rc = bh_private_dir(dir, create);
  const char *run = rc < 0 && rc != -ENOENT ? bh__xdg_runtime() : NULL;
  if (run)
    len = snprintf(buf, n, "%s/bulkhead-ledger", run); /* /dev/shm's is taken: ours cannot be */
  else if (rc < 0 && create)
    return rc; /* taken, and nowhere else of ours: the caller names the owner */
  else
    len = snprintf(buf, n, "%s/ledger", dir);
  return len < 0 || (size_t)len >= n ? -ENAMETOOLONG : len;
}
