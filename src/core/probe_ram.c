/*
 * probe_ram.c -- the CPU device's memory: /proc/meminfo clamped to the
 * cgroup's limit, and the swap total.
 *
 * Design.  A reading is MemAvailable (MemTotal for the total) from
 * /proc/meminfo, plus the free pages parked on the kernel's per-CPU lists
 * (/proc/zoneinfo's pagesets: free, but not in MemAvailable; since Linux
 * 6.7 such a list can hold hundreds of MiB that a process has just freed,
 * for minutes), clamped by every level of this process's memory cgroup:
 * the leaf named in /proc/self/cgroup and each ancestor up to the
 * hierarchy's root, because a parent's limit binds its children too and
 * the tightest level wins.  At one level, what is still available is
 *
 *     limit - (current - min(reclaimable, current)),  never below 0,
 *
 * where reclaimable is the level's inactive file cache (the kernel drops
 * it before it fails an allocation).  cgroup v2 names the files
 * memory.max ("max" = no limit), memory.current and memory.stat's
 * inactive_file; v1 names them memory.limit_in_bytes (2^62 and up = no
 * limit: the kernel reports "unlimited" as PAGE_COUNTER_MAX pages),
 * memory.usage_in_bytes and memory.stat's total_inactive_file (hierarchical,
 * like v2's).  Where the memory controller sits comes from
 * /proc/self/cgroup (a v1 line listing "memory" wins, as on hybrid
 * systems; else the v2 "0::" line), and where that hierarchy is mounted from
 * /proc/self/mountinfo, defaulting to /sys/fs/cgroup (v2) and
 * /sys/fs/cgroup/memory (v1).  The mount's own root is stripped from the
 * cgroup path (a container sees its cgroup at its mount's root); a path that
 * climbs out of the namespace ("/..") is read as the mount root.
 *
 * Every path is below a root directory argument, so the tests feed fixture
 * trees.  The decoders are total: any byte string gives a value or
 * BH_ECGROUP, naming the file.  A level whose limit file is absent or
 * unreadable imposes nothing (the controller is not enabled there, or the
 * root cgroup, which has no limit); mountinfo lines we cannot read are
 * skipped since mountinfo is only a hint.  No state is kept between calls.
 */
#include "internal.h"

#include "bulkhead/probe.h"

#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>

#define BH__FILE_MAX (16u << 20) /* mountinfo of a busy host stays far below */
#define BH__V1_UNLIMITED (1ull << 62)

typedef struct bh__ram_ctx {
  const char *root; /* "" for the real system, else the prefix without a trailing '/' */
  char *err;
  size_t errlen;
} bh__ram_ctx;

static void bh__ram_err(bh__ram_ctx *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void bh__ram_err(bh__ram_ctx *c, const char *fmt, ...) {
  if (!c->err || !c->errlen) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(c->err, c->errlen, fmt, ap);
  va_end(ap);
}

/* A malformed file: names it and returns -BH_ECGROUP. */
static int bh__ram_bad(bh__ram_ctx *c, const char *path, const char *what) {
  bh__ram_err(c, "%s: %s", path, what);
  return -BH_ECGROUP;
}

/* root + a + b into buf (PATH_MAX); -ENAMETOOLONG if it does not fit. */
static int bh__ram_path(bh__ram_ctx *c, char *buf, const char *a, const char *b) {
  int n = snprintf(buf, PATH_MAX, "%s%s%s", c->root, a, b);
  if (n < 0 || n >= PATH_MAX) {
    bh__ram_err(c, "path too long: %s%s%s", c->root, a, b);
    return -ENAMETOOLONG;
  }
  return 0;
}

/* Reads a whole file into a malloc'ed, NUL-terminated buffer (*out, owned
 * by the caller).  Returns its length or -errno; a file with a NUL byte or
 * larger than BH__FILE_MAX is malformed. */
static int bh__ram_slurp(bh__ram_ctx *c, const char *path, char **out) {
  int fd = -1, rc;
  size_t len = 0, cap = 4096;
  char *buf = NULL;
  *out = NULL;
  fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY);
  if (fd < 0) {
    rc = -errno;
    goto done;
  }
  for (;;) {
    if (!buf || len + 1 >= cap) { /* first pass, or the buffer is full */
      if (buf && cap >= BH__FILE_MAX) {
        rc = bh__ram_bad(c, path, "larger than 16 MiB");
        goto done;
      }
      if (buf) cap *= 2;
      char *nb = realloc(buf, cap);
      if (!nb) {
        rc = -ENOMEM;
        goto done;
      }
      buf = nb;
    }
    ssize_t r = read(fd, buf + len, cap - len - 1);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      rc = -errno;
      goto done;
    }
    if (r == 0) break;
    len += (size_t)r;
  }
  buf[len] = 0;
  if (strlen(buf) != len) {
    rc = bh__ram_bad(c, path, "contains a NUL byte");
    goto done;
  }
  *out = buf;
  buf = NULL;
  rc = (int)len;
done:
  free(buf);
  if (fd >= 0) bh__close(fd);
  return rc;
}

static int bh__is_blank(char ch) { return ch == ' ' || ch == '\t' || ch == '\n' || ch == '\r'; }

/* Parses a decimal u64 from s[0..n): digits, then only blanks.  1 on
 * success, 0 for anything else (empty, sign, garbage, overflow). */
static int bh__u64(const char *s, size_t n, uint64_t *v) {
  size_t i = 0;
  uint64_t x = 0;
  while (i < n && bh__is_blank(s[i])) i++;
  size_t start = i;
  for (; i < n && s[i] >= '0' && s[i] <= '9'; i++) {
    unsigned d = (unsigned)(s[i] - '0');
    if (x > (UINT64_MAX - d) / 10) return 0;
    x = x * 10 + d;
  }
  if (i == start) return 0;
  for (; i < n; i++)
    if (!bh__is_blank(s[i])) return 0;
  *v = x;
  return 1;
}

/* The next line of *p (without its '\n'); advances *p.  0 at the end. */
static int bh__line(const char **p, const char **line, size_t *n) {
  const char *s = *p;
  if (!*s) return 0;
  const char *nl = strchr(s, '\n');
  *line = s;
  *n = nl ? (size_t)(nl - s) : strlen(s);
  *p = nl ? nl + 1 : s + *n;
  return 1;
}

/* ---- /proc/meminfo ---- */

typedef struct {
  uint64_t total, available, free, buffers, cached;
  int have_total, have_available, have_free, have_buffers, have_cached;
} bh__meminfo;

/* "Key:   123 kB" -> bytes. */
static int bh__meminfo_value(const char *s, size_t n, uint64_t *bytes) {
  size_t end = n;
  while (end && bh__is_blank(s[end - 1])) end--;
  uint64_t mult = 1;
  if (end >= 2 && s[end - 2] == 'k' && s[end - 1] == 'B') {
    mult = 1024;
    end -= 2;
  }
  uint64_t v;
  if (!bh__u64(s, end, &v) || v > UINT64_MAX / mult) return 0;
  *bytes = v * mult;
  return 1;
}

static int bh__read_meminfo(bh__ram_ctx *c, bh__meminfo *m) {
  char path[PATH_MAX], *text = NULL;
  int rc = bh__ram_path(c, path, "/proc/meminfo", "");
  if (rc < 0) return rc;
  rc = bh__ram_slurp(c, path, &text);
  if (rc < 0) {
    if (rc != -BH_ECGROUP) bh__ram_err(c, "%s: %s", path, strerror(-rc));
    return rc;
  }
  static const struct {
    const char *key;
    size_t off_v, off_have;
  } keys[] = {
      {"MemTotal", offsetof(bh__meminfo, total), offsetof(bh__meminfo, have_total)},
      {"MemAvailable", offsetof(bh__meminfo, available), offsetof(bh__meminfo, have_available)},
      {"MemFree", offsetof(bh__meminfo, free), offsetof(bh__meminfo, have_free)},
      {"Buffers", offsetof(bh__meminfo, buffers), offsetof(bh__meminfo, have_buffers)},
      {"Cached", offsetof(bh__meminfo, cached), offsetof(bh__meminfo, have_cached)},
  };
  memset(m, 0, sizeof *m);
  const char *p = text, *line;
  size_t n;
  rc = 0;
  while (bh__line(&p, &line, &n)) {
    const char *colon = memchr(line, ':', n);
    if (!colon) continue; /* not a line we read */
    size_t klen = (size_t)(colon - line);
    for (size_t k = 0; k < sizeof keys / sizeof *keys; k++) {
      if (strlen(keys[k].key) != klen || memcmp(line, keys[k].key, klen) != 0) continue;
      uint64_t v;
      if (!bh__meminfo_value(colon + 1, n - klen - 1, &v)) {
        rc = bh__ram_bad(c, path, "a value is not a number of kB");
        goto done;
      }
      memcpy((char *)m + keys[k].off_v, &v, sizeof v);
      *(int *)(void *)((char *)m + keys[k].off_have) = 1;
    }
  }
  if (!m->have_total || (!m->have_available && !m->have_free)) {
    rc = bh__ram_bad(c, path, "no MemTotal or no MemAvailable/MemFree");
    goto done;
  }
  if (!m->have_available) { /* kernels before 3.14 */
    uint64_t a = m->free;
    a = a + m->buffers < a ? UINT64_MAX : a + m->buffers;
    a = a + m->cached < a ? UINT64_MAX : a + m->cached;
    m->available = a;
  }
  if (m->available > m->total) m->available = m->total;
done:
  free(text);
  return rc;
}

/* ---- /proc/swaps ---- */

static int bh__read_swaps(bh__ram_ctx *c, uint64_t *total) {
  char path[PATH_MAX], *text = NULL;
  *total = 0;
  int rc = bh__ram_path(c, path, "/proc/swaps", "");
  if (rc < 0) return rc;
  rc = bh__ram_slurp(c, path, &text);
  if (rc == -ENOENT) return 0; /* a kernel without swap support */
  if (rc < 0) {
    if (rc != -BH_ECGROUP) bh__ram_err(c, "%s: %s", path, strerror(-rc));
    return rc;
  }
  const char *p = text, *line;
  size_t n;
  int first = 1;
  uint64_t sum = 0;
  rc = 0;
  while (bh__line(&p, &line, &n)) {
    if (first) {
      first = 0;
      if (n < 8 || memcmp(line, "Filename", 8) != 0) {
        rc = bh__ram_bad(c, path, "no header line");
        goto done;
      }
      continue;
    }
    /* Filename Type Size Used Priority; names escape blanks as \040. */
    const char *f[3];
    size_t fl[3], i = 0;
    int nf = 0;
    while (nf < 3) {
      while (i < n && bh__is_blank(line[i])) i++;
      if (i == n) break;
      f[nf] = line + i;
      while (i < n && !bh__is_blank(line[i])) i++;
      fl[nf] = (size_t)(line + i - f[nf]);
      nf++;
    }
    if (nf == 0) continue; /* blank line */
    uint64_t kib;
    if (nf < 3 || !bh__u64(f[2], fl[2], &kib) || kib > UINT64_MAX / 1024 ||
        sum + kib * 1024 < sum) {
      rc = bh__ram_bad(c, path, "a line has no size in KiB");
      goto done;
    }
    sum += kib * 1024;
  }
  *total = sum;
done:
  free(text);
  return rc;
}

/* ---- /proc/zoneinfo: free pages on per-CPU lists ---- */

/* Sums "count:" over every pageset (one per CPU per zone).  Optional and
 * best effort: a missing, unreadable or odd file adds nothing (*valid 0),
 * and a line that does not parse is skipped. */
static void bh__read_pcp(bh__ram_ctx *c, uint64_t *bytes, int *valid) {
  char path[PATH_MAX], *text = NULL;
  *bytes = 0;
  *valid = 0;
  if (bh__ram_path(c, path, "/proc/zoneinfo", "") < 0) return;
  bh__ram_ctx quiet = *c; /* an odd zoneinfo is no error to report */
  quiet.err = NULL;
  if (bh__ram_slurp(&quiet, path, &text) < 0) return;
  long page = sysconf(_SC_PAGESIZE);
  uint64_t pages = 0;
  const char *p = text, *line;
  size_t n;
  while (bh__line(&p, &line, &n)) {
    size_t i = 0;
    while (i < n && bh__is_blank(line[i])) i++;
    uint64_t v;
    if (n - i > 6 && memcmp(line + i, "count:", 6) == 0 && bh__u64(line + i + 6, n - i - 6, &v))
      pages = v > UINT64_MAX - pages ? UINT64_MAX : pages + v;
  }
  free(text);
  if (page <= 0) return;
  *bytes = pages > UINT64_MAX / (uint64_t)page ? UINT64_MAX : pages * (uint64_t)page;
  *valid = 1;
}

/* ---- where the memory controller is ---- */

typedef struct {
  int version; /* 1, 2, or 0: none */
  char path[PATH_MAX];  /* cgroup path, from /proc/self/cgroup */
  char mount[PATH_MAX]; /* the hierarchy's mount point (absolute, without root) */
  char mount_root[PATH_MAX];
} bh__cgroup_loc;

/* Is `tok` one of the comma-separated entries of s[0..n)? */
static int bh__has_token(const char *s, size_t n, const char *tok) {
  size_t tl = strlen(tok), i = 0;
  while (i <= n) {
    size_t j = i;
    while (j < n && s[j] != ',') j++;
    if (j - i == tl && memcmp(s + i, tok, tl) == 0) return 1;
    i = j + 1;
  }
  return 0;
}

static int bh__read_self_cgroup(bh__ram_ctx *c, bh__cgroup_loc *loc) {
  char path[PATH_MAX], *text = NULL;
  char v2[PATH_MAX];
  int have_v2 = 0;
  loc->version = 0;
  int rc = bh__ram_path(c, path, "/proc/self/cgroup", "");
  if (rc < 0) return rc;
  rc = bh__ram_slurp(c, path, &text);
  if (rc == -ENOENT) return 0; /* a kernel without cgroups */
  if (rc < 0) {
    if (rc != -BH_ECGROUP) bh__ram_err(c, "%s: %s", path, strerror(-rc));
    return rc;
  }
  const char *p = text, *line;
  size_t n;
  rc = 0;
  while (bh__line(&p, &line, &n)) {
    if (n == 0) continue;
    const char *c1 = memchr(line, ':', n);
    const char *c2 = c1 ? memchr(c1 + 1, ':', n - (size_t)(c1 + 1 - line)) : NULL;
    if (!c1 || !c2 || c2 + 1 == line + n || c2[1] != '/') {
      rc = bh__ram_bad(c, path, "a line is not id:controllers:/path");
      goto done;
    }
    const char *ctl = c1 + 1, *cpath = c2 + 1;
    size_t ctl_n = (size_t)(c2 - ctl), path_n = (size_t)(line + n - cpath);
    if (path_n >= PATH_MAX) {
      rc = bh__ram_bad(c, path, "a cgroup path is too long");
      goto done;
    }
    if (c1 - line == 1 && line[0] == '0' && ctl_n == 0) {
      memcpy(v2, cpath, path_n);
      v2[path_n] = 0;
      have_v2 = 1;
    } else if (bh__has_token(ctl, ctl_n, "memory")) {
      memcpy(loc->path, cpath, path_n);
      loc->path[path_n] = 0;
      loc->version = 1;
    }
  }
  if (loc->version == 0 && have_v2) {
    memcpy(loc->path, v2, sizeof v2);
    loc->version = 2;
  }
done:
  free(text);
  return rc;
}

/* Copies one mountinfo field, undoing its \NNN octal escapes.  0 when it
 * does not fit. */
static int bh__unescape(const char *s, size_t n, char *out, size_t cap) {
  size_t o = 0;
  for (size_t i = 0; i < n; i++) {
    char ch = s[i];
    if (ch == '\\' && i + 3 < n && s[i + 1] >= '0' && s[i + 1] <= '3' && s[i + 2] >= '0' && s[i + 2] <= '7' &&
        s[i + 3] >= '0' && s[i + 3] <= '7') {
      ch = (char)((s[i + 1] - '0') * 64 + (s[i + 2] - '0') * 8 + (s[i + 3] - '0'));
      i += 3;
    }
    if (o + 1 >= cap) return 0;
    out[o++] = ch;
  }
  out[o] = 0;
  return 1;
}

/* Finds the mount of loc->version's hierarchy in mountinfo; defaults when
 * there is no mountinfo or no such line. */
static int bh__find_mount(bh__ram_ctx *c, bh__cgroup_loc *loc) {
  char path[PATH_MAX], *text = NULL;
  snprintf(loc->mount, sizeof loc->mount, "%s",
           loc->version == 1 ? "/sys/fs/cgroup/memory" : "/sys/fs/cgroup");
  snprintf(loc->mount_root, sizeof loc->mount_root, "/");
  int rc = bh__ram_path(c, path, "/proc/self/mountinfo", "");
  if (rc < 0) return rc;
  rc = bh__ram_slurp(c, path, &text);
  if (rc < 0) return rc == -ENOMEM || rc == -BH_ECGROUP ? rc : 0; /* a hint only */
  const char *p = text, *line;
  size_t n;
  while (bh__line(&p, &line, &n)) {
    /* id parent maj:min root mountpoint opts [optional...] - fstype source superopts */
    const char *f[16];
    size_t fl[16], i = 0;
    int nf = 0, dash = -1;
    while (nf < 16) {
      while (i < n && line[i] == ' ') i++;
      if (i == n) break;
      f[nf] = line + i;
      while (i < n && line[i] != ' ') i++;
      fl[nf] = (size_t)(line + i - f[nf]);
      if (dash < 0 && nf >= 6 && fl[nf] == 1 && f[nf][0] == '-') dash = nf;
      nf++;
    }
    if (dash < 0 || nf < dash + 3) continue;
    const char *fstype = f[dash + 1];
    size_t ftl = fl[dash + 1];
    int match;
    if (loc->version == 2)
      match = ftl == 7 && memcmp(fstype, "cgroup2", 7) == 0;
    else /* v1 names its controllers in the super options, after the source */
      match = nf > dash + 3 && ftl == 6 && memcmp(fstype, "cgroup", 6) == 0 &&
              bh__has_token(f[dash + 3], fl[dash + 3], "memory");
    if (!match) continue;
    char mnt[PATH_MAX], mroot[PATH_MAX];
    if (!bh__unescape(f[4], fl[4], mnt, sizeof mnt) ||
        !bh__unescape(f[3], fl[3], mroot, sizeof mroot) || mnt[0] != '/')
      continue;
    memcpy(loc->mount, mnt, sizeof mnt);
    memcpy(loc->mount_root, mroot, sizeof mroot);
    break;
  }
  free(text);
  return 0;
}

/* Makes loc->path relative to the mount's root and safe to walk: no "..",
 * no trailing '/', "/" for the hierarchy's root. */
static void bh__normalize_path(bh__cgroup_loc *loc) {
  char *s = loc->path;
  size_t rl = strlen(loc->mount_root);
  while (rl > 1 && loc->mount_root[rl - 1] == '/') loc->mount_root[--rl] = 0;
  if (rl > 1 && strncmp(s, loc->mount_root, rl) == 0 && (s[rl] == '/' || s[rl] == 0))
    memmove(s, s + rl, strlen(s + rl) + 1);
  if (s[0] != '/' || strstr(s, "/../") || (strlen(s) >= 3 && strcmp(s + strlen(s) - 3, "/..") == 0)) {
    strcpy(s, "/");
    return;
  }
  size_t l = strlen(s);
  while (l > 1 && s[l - 1] == '/') s[--l] = 0;
}

/* ---- one level of the hierarchy ---- */

typedef struct {
  int limited;
  uint64_t limit, current, reclaimable, available;
} bh__level;

/* The value of `key` in a memory.stat text ("key value" lines): 1 found,
 * 0 absent, -BH_ECGROUP malformed. */
static int bh__stat_key(const char *text, const char *key, uint64_t *v) {
  const char *p = text, *line;
  size_t n, kl = strlen(key);
  while (bh__line(&p, &line, &n)) {
    if (n > kl && memcmp(line, key, kl) == 0 && line[kl] == ' ')
      return bh__u64(line + kl + 1, n - kl - 1, v) ? 1 : -BH_ECGROUP;
  }
  return 0;
}

static int bh__read_level(bh__ram_ctx *c, const bh__cgroup_loc *loc, const char *dir,
                          bh__level *lv) {
  char base[PATH_MAX], path[PATH_MAX], *text = NULL;
  int rc;
  memset(lv, 0, sizeof *lv);
  if (snprintf(base, sizeof base, "%s%s", loc->mount, strcmp(dir, "/") ? dir : "") >=
      (int)sizeof base)
    return -ENAMETOOLONG;
  const int v1 = loc->version == 1;

  if ((rc = bh__ram_path(c, path, base, v1 ? "/memory.limit_in_bytes" : "/memory.max")) < 0)
    return rc;
  rc = bh__ram_slurp(c, path, &text);
  if (rc == -BH_ECGROUP || rc == -ENOMEM) goto done;
  if (rc < 0) { /* no controller here (or the root): no limit */
    rc = 0;
    goto done;
  }
  uint64_t limit;
  if (!v1) {
    const char *t = text;
    while (bh__is_blank(*t)) t++;
    size_t tl = strlen(t);
    while (tl && bh__is_blank(t[tl - 1])) tl--;
    if (tl == 3 && memcmp(t, "max", 3) == 0) {
      rc = 0; /* unlimited */
      goto done;
    }
  }
  if (!bh__u64(text, strlen(text), &limit)) {
    rc = bh__ram_bad(c, path, "not a number of bytes");
    goto done;
  }
  if (v1 && limit >= BH__V1_UNLIMITED) {
    rc = 0;
    goto done;
  }
  free(text);
  text = NULL;

  if ((rc = bh__ram_path(c, path, base, v1 ? "/memory.usage_in_bytes" : "/memory.current")) < 0)
    goto done;
  rc = bh__ram_slurp(c, path, &text);
  if (rc < 0) {
    if (rc != -BH_ECGROUP && rc != -ENOMEM) rc = bh__ram_bad(c, path, "unreadable beside a limit");
    goto done;
  }
  uint64_t current;
  if (!bh__u64(text, strlen(text), &current)) {
    rc = bh__ram_bad(c, path, "not a number of bytes");
    goto done;
  }
  free(text);
  text = NULL;

  uint64_t reclaim = 0;
  if ((rc = bh__ram_path(c, path, base, "/memory.stat")) < 0) goto done;
  rc = bh__ram_slurp(c, path, &text);
  if (rc == -BH_ECGROUP || rc == -ENOMEM) goto done;
  if (rc >= 0) {
    int found = bh__stat_key(text, v1 ? "total_inactive_file" : "inactive_file", &reclaim);
    if (found == 0 && v1) found = bh__stat_key(text, "inactive_file", &reclaim);
    if (found < 0) {
      rc = bh__ram_bad(c, path, "inactive_file is not a number");
      goto done;
    }
  }
  uint64_t used = current - (reclaim < current ? reclaim : current);
  lv->limited = 1;
  lv->limit = limit;
  lv->current = current;
  lv->reclaimable = reclaim;
  lv->available = limit > used ? limit - used : 0;
  rc = 0;
done:
  free(text);
  return rc;
}

int bh_ram_read(const char *root, bh_ram_reading *out, char *err, size_t errlen) {
  if (err && errlen) err[0] = 0;
  if (!out) return -EINVAL;
  memset(out, 0, sizeof *out);
  if (root && !root[0]) return -EINVAL;
  bh__ram_ctx c = {.root = "", .err = err, .errlen = errlen};
  char rootbuf[PATH_MAX];
  if (root && strcmp(root, "/") != 0) {
    size_t rl = strlen(root);
    while (rl > 1 && root[rl - 1] == '/') rl--;
    if (rl >= sizeof rootbuf) return -ENAMETOOLONG;
    memcpy(rootbuf, root, rl);
    rootbuf[rl] = 0;
    c.root = rootbuf;
  }
  bh__meminfo mi;
  uint64_t swap;
  bh__cgroup_loc *loc = calloc(1, sizeof *loc); /* three PATH_MAX buffers: off the stack */
  if (!loc) return -ENOMEM;
  int rc = bh__read_meminfo(&c, &mi);
  if (rc < 0) goto done;
  if ((rc = bh__read_swaps(&c, &swap)) < 0) goto done;
  if ((rc = bh__read_self_cgroup(&c, loc)) < 0) goto done;

  bh_ram_reading r = {0};
  r.meminfo_total_bytes = mi.total;
  r.meminfo_available_bytes = mi.available;
  r.swap_total_bytes = swap;
  r.cgroup_version = loc->version;
  uint64_t min_limit = 0; /* the smallest limit of any level bounds the total */
  int min_limit_set = 0;
  if (loc->version) {
    if ((rc = bh__find_mount(&c, loc)) < 0) goto done;
    bh__normalize_path(loc);
    /* Leaf to root; the tightest level wins. */
    char dir[PATH_MAX];
    memcpy(dir, loc->path, sizeof dir);
    for (;;) {
      bh__level lv;
      if ((rc = bh__read_level(&c, loc, dir, &lv)) < 0) goto done;
      if (lv.limited && (!min_limit_set || lv.limit < min_limit)) {
        min_limit = lv.limit;
        min_limit_set = 1;
      }
      if (lv.limited && (!r.limited || lv.available < r.available_bytes)) {
        r.limited = 1;
        r.cgroup_limit_bytes = lv.limit;
        r.cgroup_current_bytes = lv.current;
        r.cgroup_reclaimable_bytes = lv.reclaimable;
        r.available_bytes = lv.available; /* the level's, clamped below */
      }
      if (strcmp(dir, "/") == 0) break;
      char *slash = strrchr(dir, '/');
      if (slash == dir) slash[1] = 0;
      else *slash = 0;
    }
  }
  /* The machine's figure: MemAvailable and the free pages it leaves out
   * (a cgroup's own figure needs no such help: frees uncharge at once). */
  bh__read_pcp(&c, &r.pcp_free_bytes, &r.pcp_valid);
  uint64_t host_available = mi.available + r.pcp_free_bytes;
  if (host_available < mi.available || host_available > mi.total) host_available = mi.total;
  r.total_bytes = mi.total;
  if (r.limited) {
    if (min_limit < r.total_bytes) r.total_bytes = min_limit;
    if (host_available < r.available_bytes) r.available_bytes = host_available;
  } else {
    r.available_bytes = host_available;
  }
  if (r.available_bytes > r.total_bytes) r.available_bytes = r.total_bytes;
  r.valid = 1;
  *out = r;
  rc = 0;
done:
  free(loc);
  return rc;
}
