/*
 * fuzz_ram.c -- the RAM probe's parsers (src/core/probe_ram.c) on
 * arbitrary file contents.
 *
 * bh_ram_read reads every file below a root directory argument, so an
 * input becomes a fixture tree (in a private directory under $TMPDIR or
 * /tmp, removed at exit): the input is split at NUL bytes (no file of
 * these may hold one) into up to eleven pieces,
 *
 *   0 proc/meminfo          4 leaf limit     7 root limit
 *   1 proc/swaps            5 leaf usage     8 root usage
 *   2 proc/self/cgroup      6 leaf stat      9 root stat
 *   3 proc/self/mountinfo                   10 proc/zoneinfo
 *
 * where "leaf" is the cgroup /w and "root" the hierarchy's root, each
 * written under both the v2 default mount (sys/fs/cgroup: memory.max,
 * memory.current, memory.stat) and the v1 one (sys/fs/cgroup/memory:
 * memory.limit_in_bytes, memory.usage_in_bytes, memory.stat).  A piece the
 * input does not reach is a missing file.  Only the files that changed
 * since the last input are rewritten.
 *
 * Checked: the documented return codes, an error message naming the file
 * with every -BH_ECGROUP, and for a reading: valid, available <= total,
 * the total no more than meminfo's, the available no more than meminfo's
 * plus the per-CPU lists' (zero unless zoneinfo was read), the cgroup
 * figures zero unless limited.
 */
#include "fuzz.h"
#include "bulkhead/probe.h"

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define PIECES 11

static const char *const files[PIECES][2] = {
    {"proc/meminfo", NULL},
    {"proc/swaps", NULL},
    {"proc/self/cgroup", NULL},
    {"proc/self/mountinfo", NULL},
    {"sys/fs/cgroup/w/memory.max", "sys/fs/cgroup/memory/w/memory.limit_in_bytes"},
    {"sys/fs/cgroup/w/memory.current", "sys/fs/cgroup/memory/w/memory.usage_in_bytes"},
    {"sys/fs/cgroup/w/memory.stat", "sys/fs/cgroup/memory/w/memory.stat"},
    {"sys/fs/cgroup/memory.max", "sys/fs/cgroup/memory/memory.limit_in_bytes"},
    {"sys/fs/cgroup/memory.current", "sys/fs/cgroup/memory/memory.usage_in_bytes"},
    {"sys/fs/cgroup/memory.stat", "sys/fs/cgroup/memory/memory.stat"},
    {"proc/zoneinfo", NULL},
};

static char root[256];
static struct {
  int present;
  uint8_t *data;
  size_t len;
} last[PIECES];

static int rm_one(const char *p, const struct stat *st, int flag, struct FTW *ftw) {
  (void)st, (void)flag, (void)ftw;
  return remove(p);
}

static void cleanup(void) {
  if (root[0]) nftw(root, rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

static void mkdirs(const char *rel) {
  char p[512];
  snprintf(p, sizeof p, "%s/%s", root, rel);
  for (char *s = p + strlen(root) + 1; *s; s++) {
    if (*s != '/') continue;
    *s = 0;
    FUZZ_CHECK(mkdir(p, 0700) == 0 || errno == EEXIST);
    *s = '/';
  }
}

static void put(const char *rel, const uint8_t *data, size_t len, int present) {
  char p[512];
  snprintf(p, sizeof p, "%s/%s", root, rel);
  if (!present) {
    FUZZ_CHECK(unlink(p) == 0 || errno == ENOENT);
    return;
  }
  int fd = open(p, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  FUZZ_CHECK(fd >= 0);
  FUZZ_CHECK(len == 0 || write(fd, data, len) == (ssize_t)len);
  close(fd);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc, (void)argv;
  const char *tmp = getenv("TMPDIR");
  snprintf(root, sizeof root, "%s/bh-fuzz-ram-XXXXXX", tmp && *tmp ? tmp : "/tmp");
  FUZZ_CHECK(mkdtemp(root) != NULL);
  atexit(cleanup);
  for (int i = 0; i < PIECES; i++)
    for (int k = 0; k < 2; k++)
      if (files[i][k]) mkdirs(files[i][k]);
  return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  size_t at = 0;
  for (int i = 0; i < PIECES; i++) {
    int present = at < size || (i == 0 && size == 0);
    const uint8_t *p = data + at;
    size_t len = 0;
    if (present) {
      const uint8_t *nul = memchr(p, 0, size - at);
      len = nul ? (size_t)(nul - p) : size - at;
      at += len + 1; /* past the NUL (or the end) */
    }
    if (present == last[i].present && len == last[i].len && (!len || !memcmp(p, last[i].data, len)))
      continue;
    for (int k = 0; k < 2; k++)
      if (files[i][k]) put(files[i][k], p, len, present);
    free(last[i].data);
    last[i].data = len ? malloc(len) : NULL;
    if (len) memcpy(last[i].data, p, len);
    last[i].len = len;
    last[i].present = present;
  }

  bh_ram_reading r;
  char err[512];
  memset(err, 'x', sizeof err);
  int rc = bh_ram_read(root, &r, err, sizeof err);
  FUZZ_CHECK(memchr(err, 0, sizeof err) != NULL);
  if (rc < 0) {
    FUZZ_CHECK(r.valid == 0);
    if (rc == -BH_ECGROUP) FUZZ_CHECK(err[0] != 0);
    FUZZ_RC_IN(rc, -BH_ECGROUP, -ENOENT, -ENAMETOOLONG, -ENOTDIR, -EISDIR);
    return 0;
  }
  FUZZ_CHECK(rc == 0 && r.valid == 1);
  FUZZ_CHECK(r.available_bytes <= r.total_bytes);
  FUZZ_CHECK(r.total_bytes <= r.meminfo_total_bytes);
  FUZZ_CHECK(r.pcp_valid == 1 || r.pcp_free_bytes == 0);
  uint64_t host = r.meminfo_available_bytes + r.pcp_free_bytes;
  if (host < r.pcp_free_bytes) host = UINT64_MAX;
  FUZZ_CHECK(r.available_bytes <= host);
  FUZZ_CHECK(r.cgroup_version >= 0 && r.cgroup_version <= 2);
  if (!r.limited)
    FUZZ_CHECK(r.cgroup_limit_bytes == 0 && r.cgroup_current_bytes == 0 &&
               r.cgroup_reclaimable_bytes == 0);
  else
    FUZZ_CHECK(r.total_bytes <= r.cgroup_limit_bytes); /* the smallest limit bounds it */
  return 0;
}
