/*
 * fake_cuda.c -- a FAKE libcuda.so.1 (the CUDA driver API), built into the
 * build tree as tests/c/fake_cuda/libcuda.so.1 so tools/gpu-check.c can
 * run its whole flow on a machine without a GPU.  It implements only the
 * dozen calls gpu-check makes, with the driver's names and calling
 * conventions (declared here; no NVIDIA header), and no real GPU work.
 *
 * Design.  Its device is the fake NVML's: both read the text file named by
 * BH_FAKE_NVML (see fake_nvml.c for the `device` lines).  CUDA device i is
 * the file's i-th `device` line, or the i-th CUDA_VISIBLE_DEVICES names
 * (line numbers or UUID prefixes, as CUDA reads it), its UUID that line's
 * "GPU-..." string as 16 bytes.  Creating a context and
 * allocating memory take bytes from the line's free= and add them to
 * used=; destroying and freeing give them back.  The file is rewritten
 * under flock(<file>.lock), into <file>.cuda.<pid> and renamed over the
 * file (a new inode: the fake NVML sees the change), so NVML in another
 * process sees every allocation device-wide, as with the real driver.
 * Memory a killed process held stays taken, like a leak.
 *
 * Extra lines it reads (the fake NVML ignores them):
 *
 *   cuda context=N            a context costs N bytes (default 0)
 *   cuda skew=N               cuMemGetInfo reports free + N (N may be < 0)
 *   cuda invisible            allocations do not reach the file (a driver
 *                             whose NVML does not see them)
 *   cuda sleep_ms=N           cuMemAlloc sleeps N ms first
 *   cuda uuid=<uuid>          every device reports this UUID (a CUDA that
 *                             disagrees with NVML)
 *   fail <cuSymbol>=<CUresult> that call fails ("fail cuMemAlloc_v2=2")
 *
 * Without the variable, the file, or a device line, cuInit fails with
 * CUDA_ERROR_NO_DEVICE (100).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <time.h>
#include <unistd.h>

#define API __attribute__((visibility("default")))

typedef int CUresult;
typedef int CUdevice;
typedef struct fake_ctx *CUcontext;
typedef unsigned long long CUdeviceptr;
typedef struct { unsigned char bytes[16]; } CUuuid;

enum {
  OK = 0,
  E_INVALID_VALUE = 1,
  E_OUT_OF_MEMORY = 2,
  E_NOT_INITIALIZED = 3,
  E_NO_DEVICE = 100,
  E_INVALID_DEVICE = 101,
  E_INVALID_CONTEXT = 201,
};

#define MAX_DEV 16
#define MAX_ALLOC 1024

struct fake_ctx {
  int dev;  /* CUDA ordinal */
  int line; /* its `device` line */
};

typedef struct {
  char uuid[96];
  long long total, free, used;
  int line; /* which `device` line of the file, from 0 */
} fake_dev;

typedef struct {
  int n_dev;
  fake_dev dev[MAX_DEV];
  long long context, skew, sleep_ms;
  int invisible;
  char uuid[96]; /* `cuda uuid=`: reported for every device instead */
} state;

/* Process-local: init flag, current context, live allocations. */
static int g_inited;
static CUcontext g_cur;
static struct {
  CUdeviceptr ptr;
  size_t size;
  int line;
} g_alloc[MAX_ALLOC];
static CUdeviceptr g_next = 0x7f0000000000ull;

static long long kv(const char *line, const char *key, long long dflt) {
  char pat[32];
  snprintf(pat, sizeof pat, " %s=", key);
  const char *p = strstr(line, pat);
  return p ? strtoll(p + strlen(pat), NULL, 0) : dflt;
}

/* Keeps the devices CUDA_VISIBLE_DEVICES names, in its order: entries are
 * line numbers or UUID prefixes; the first invalid one ends the list. */
static void visible(state *s) {
  const char *cvd = getenv("CUDA_VISIBLE_DEVICES");
  fake_dev all[MAX_DEV];
  int n = s->n_dev, used[MAX_DEV] = {0};
  if (!cvd) return;
  memcpy(all, s->dev, sizeof all);
  s->n_dev = 0;
  for (const char *p = cvd; *p && s->n_dev < n;) {
    size_t len = strcspn(p, ",");
    int pick = -1;
    char *end;
    long v = strtol(p, &end, 10);
    if (len && (size_t)(end - p) == len && v >= 0 && v < n) pick = (int)v;
    for (int i = 0; len && pick < 0 && i < n; i++)
      if (strncmp(all[i].uuid, p, len) == 0) pick = i;
    if (pick < 0 || used[pick]++) break;
    s->dev[s->n_dev++] = all[pick];
    p += len + (p[len] == ',');
  }
}

/* Reads the file into s; 0, or -1 when there is none.  A `fail` line for
 * sym sets *fail_code (when fail_code is not NULL). */
static int load(state *s, const char *sym, int *fail_code) {
  const char *path = getenv("BH_FAKE_NVML");
  FILE *f = path ? fopen(path, "re") : NULL;
  char line[512];
  memset(s, 0, sizeof *s);
  if (!f) return -1;
  while (fgets(line, sizeof line, f)) {
    if (strncmp(line, "device ", 7) == 0 && s->n_dev < MAX_DEV) {
      fake_dev *d = &s->dev[s->n_dev];
      d->line = s->n_dev++;
      sscanf(line, "%*s %95s", d->uuid);
      d->total = kv(line, "total", 0);
      d->free = kv(line, "free", 0);
      d->used = kv(line, "used", 0);
    } else if (strncmp(line, "cuda ", 5) == 0) {
      s->context = kv(line, "context", s->context);
      s->skew = kv(line, "skew", s->skew);
      s->sleep_ms = kv(line, "sleep_ms", s->sleep_ms);
      if (strstr(line, " invisible")) s->invisible = 1;
      if (strncmp(line, "cuda uuid=", 10) == 0) sscanf(line + 10, "%95s", s->uuid);
    } else if (sym && fail_code && strncmp(line, "fail ", 5) == 0) {
      size_t n = strlen(sym);
      if (strncmp(line + 5, sym, n) == 0 && line[5 + n] == '=') *fail_code = atoi(line + 6 + n);
    }
  }
  fclose(f);
  visible(s);
  if (s->uuid[0])
    for (int i = 0; i < s->n_dev; i++) memcpy(s->dev[i].uuid, s->uuid, sizeof s->uuid);
  return 0;
}

/* Entry to every call: the configured failure of sym, NOT_INITIALIZED
 * before cuInit, else OK with the state in s. */
static CUresult enter(const char *sym, state *s) {
  int code = OK;
  if (!g_inited && strcmp(sym, "cuInit") != 0) return E_NOT_INITIALIZED;
  if (load(s, sym, &code) < 0 || s->n_dev == 0) return E_NO_DEVICE;
  return code;
}

/* Moves `bytes` of the free= to the used= (negative: back) of the file's
 * `device` line number `dev`, atomically against the other processes.
 * 0 or -1. */
static int take(int dev, long long bytes) {
  const char *path = getenv("BH_FAKE_NVML");
  char lock[4096], tmp[4096], line[512];
  int lfd = -1, rc = -1, k = 0;
  FILE *in = NULL, *out = NULL;
  if (!path) return -1;
  snprintf(lock, sizeof lock, "%s.lock", path);
  snprintf(tmp, sizeof tmp, "%s.cuda.%d", path, (int)getpid());
  if ((lfd = open(lock, O_RDWR | O_CREAT | O_CLOEXEC, 0600)) < 0 || flock(lfd, LOCK_EX) < 0)
    goto done;
  if (!(in = fopen(path, "re")) || !(out = fopen(tmp, "we"))) goto done;
  while (fgets(line, sizeof line, in)) {
    if (strncmp(line, "device ", 7) == 0 && k++ == dev) {
      char *q1 = strchr(line, '"'), *q2 = q1 ? strchr(q1 + 1, '"') : NULL;
      if (!q2) goto done;
      fprintf(out, "%.*s total=%lld free=%lld used=%lld reserved=%lld\n", (int)(q2 + 1 - line),
              line, kv(line, "total", 0), kv(line, "free", 0) - bytes,
              kv(line, "used", 0) + bytes, kv(line, "reserved", 0));
    } else {
      fputs(line, out);
    }
  }
  if (fclose(out) == 0 && rename(tmp, path) == 0) rc = 0;
  out = NULL;
done:
  if (out) fclose(out);
  if (in) fclose(in);
  if (rc < 0) unlink(tmp);
  if (lfd >= 0) close(lfd); /* drops the lock */
  return rc;
}

API CUresult cuInit(unsigned flags) {
  state s;
  CUresult rc = enter("cuInit", &s);
  if (rc == OK && flags != 0) rc = E_INVALID_VALUE;
  if (rc == OK) g_inited = 1;
  return rc;
}

API CUresult cuDeviceGetCount(int *n) {
  state s;
  CUresult rc = enter("cuDeviceGetCount", &s);
  if (rc == OK && !n) rc = E_INVALID_VALUE;
  if (rc == OK) *n = s.n_dev;
  return rc;
}

API CUresult cuDeviceGet(CUdevice *d, int ordinal) {
  state s;
  CUresult rc = enter("cuDeviceGet", &s);
  if (rc == OK && !d) rc = E_INVALID_VALUE;
  if (rc == OK && (ordinal < 0 || ordinal >= s.n_dev)) rc = E_INVALID_DEVICE;
  if (rc == OK) *d = ordinal;
  return rc;
}

static CUresult get_uuid(const char *sym, CUuuid *u, CUdevice d) {
  state s;
  CUresult rc = enter(sym, &s);
  if (rc != OK) return rc;
  if (!u) return E_INVALID_VALUE;
  if (d < 0 || d >= s.n_dev) return E_INVALID_DEVICE;
  const char *p = strchr(s.dev[d].uuid, '-'); /* after "GPU" */
  memset(u, 0, sizeof *u);
  for (int i = 0; p && *p && i < 32; p++) {
    unsigned v;
    if (*p == '-' || sscanf(p, "%1x", &v) != 1) continue;
    u->bytes[i / 2] = (unsigned char)(u->bytes[i / 2] << 4 | v);
    i++;
  }
  return OK;
}

API CUresult cuDeviceGetUuid_v2(CUuuid *u, CUdevice d) { return get_uuid("cuDeviceGetUuid_v2", u, d); }
API CUresult cuDeviceGetUuid(CUuuid *u, CUdevice d) { return get_uuid("cuDeviceGetUuid", u, d); }

API CUresult cuCtxCreate_v2(CUcontext *out, unsigned flags, CUdevice d) {
  state s;
  CUresult rc = enter("cuCtxCreate_v2", &s);
  (void)flags;
  if (rc != OK) return rc;
  if (!out) return E_INVALID_VALUE;
  if (d < 0 || d >= s.n_dev) return E_INVALID_DEVICE;
  if (s.dev[d].free < s.context) return E_OUT_OF_MEMORY;
  CUcontext c = malloc(sizeof *c);
  if (!c) return E_OUT_OF_MEMORY;
  c->dev = d;
  c->line = s.dev[d].line;
  if (s.context && take(c->line, s.context) < 0) {
    free(c);
    return E_INVALID_VALUE;
  }
  *out = g_cur = c;
  return OK;
}

API CUresult cuCtxDestroy_v2(CUcontext c) {
  state s;
  CUresult rc = enter("cuCtxDestroy_v2", &s);
  if (rc != OK) return rc;
  if (!c) return E_INVALID_CONTEXT;
  if (s.context) take(c->line, -s.context);
  if (g_cur == c) g_cur = NULL;
  free(c);
  return OK;
}

API CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t bytes) {
  state s;
  CUresult rc = enter("cuMemAlloc_v2", &s);
  int slot = 0;
  if (rc != OK) return rc;
  if (!g_cur) return E_INVALID_CONTEXT;
  if (!p || bytes == 0) return E_INVALID_VALUE;
  if (s.sleep_ms > 0) nanosleep(&(struct timespec){s.sleep_ms / 1000, s.sleep_ms % 1000 * 1000000}, NULL);
  while (slot < MAX_ALLOC && g_alloc[slot].ptr) slot++;
  if (slot == MAX_ALLOC || (long long)bytes > s.dev[g_cur->dev].free) return E_OUT_OF_MEMORY;
  if (!s.invisible && take(g_cur->line, (long long)bytes) < 0) return E_INVALID_VALUE;
  g_alloc[slot].ptr = *p = g_next;
  g_alloc[slot].size = bytes;
  g_alloc[slot].line = g_cur->line;
  g_next += (bytes + 0xfffff) & ~0xfffffull;
  return OK;
}

API CUresult cuMemFree_v2(CUdeviceptr p) {
  state s;
  CUresult rc = enter("cuMemFree_v2", &s);
  if (rc != OK) return rc;
  for (int i = 0; i < MAX_ALLOC; i++)
    if (p && g_alloc[i].ptr == p) {
      if (!s.invisible) take(g_alloc[i].line, -(long long)g_alloc[i].size);
      g_alloc[i].ptr = 0;
      return OK;
    }
  return E_INVALID_VALUE;
}

API CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total_bytes) {
  state s;
  CUresult rc = enter("cuMemGetInfo_v2", &s);
  if (rc != OK) return rc;
  if (!g_cur) return E_INVALID_CONTEXT;
  if (!free_bytes || !total_bytes) return E_INVALID_VALUE;
  *free_bytes = (size_t)(s.dev[g_cur->dev].free + s.skew);
  *total_bytes = (size_t)s.dev[g_cur->dev].total;
  return OK;
}

API CUresult cuGetErrorString(CUresult rc, const char **out) {
  static const struct { int rc; const char *s; } names[] = {
      {OK, "no error"},
      {E_INVALID_VALUE, "invalid argument"},
      {E_OUT_OF_MEMORY, "out of memory"},
      {E_NOT_INITIALIZED, "initialization error"},
      {E_NO_DEVICE, "no CUDA-capable device is detected"},
      {E_INVALID_DEVICE, "invalid device ordinal"},
      {E_INVALID_CONTEXT, "invalid device context"},
  };
  if (!out) return E_INVALID_VALUE;
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
    if (names[i].rc == rc) {
      *out = names[i].s;
      return OK;
    }
  *out = NULL;
  return E_INVALID_VALUE;
}
