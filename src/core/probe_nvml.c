/*
 * probe_nvml.c -- the GPU probe: a device list over any backend, and the
 * NVML backend, read in-process through dlopen.
 *
 * Design.  A probe (`bh_gpu`) is a backend (`struct bh_gpu_backend`, a
 * table of function pointers), its context, and the device UUIDs cached
 * when it opened.  Everything that is arithmetic on those UUIDs -- UUID
 * prefix matching, CUDA_VISIBLE_DEVICES -- lives in the generic half and
 * is the same for the real NVML and for any test double, so table tests
 * need no driver.  (nvtop `struct gpu_vendor`.)
 *
 * NVML without NVIDIA's header.  The few types we need are declared here
 * with NVML's exact layouts.  Symbols are resolved with dlsym into a
 * per-context table (not process-wide statics: a test opens the fake and
 * a broken library side by side, and NVML itself refcounts init/shutdown,
 * so two contexts are harmless).  The `_v2` name of a symbol is tried
 * before the plain one; optional symbols (memory v2, error strings, the
 * compute-process list, handle-by-UUID) may be NULL and are checked at
 * every use.  Opening is all-or-nothing: a missing required symbol or a
 * failed nvmlInit dlclose()s the library again, and the reason (dlerror()'s
 * text, or NVML's error string) is kept for the caller.  The v2 memory
 * struct carries its version tag, sizeof(struct) | 2 << 24; a driver that
 * answers the v2 call with "function not found" or "version mismatch" is
 * read with the v1 call from then on.
 *
 * Device handles are fetched once at open, by index, for every device the
 * driver reports; a memory read is then one driver call.  MIG instances are
 * not in NVML's index enumeration: a full "MIG-..." UUID is looked up with
 * nvmlDeviceGetHandleByUUID and given an index after the physical devices,
 * appended under a mutex to a fixed table that readers index without
 * locking (the count is published with release/acquire).
 */
#include "internal.h"

#include "bulkhead/probe.h"

#include <ctype.h>
#include <dlfcn.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <strings.h>

/* ------------------------------------------------------------- generic */

struct bh_gpu {
  const struct bh_gpu_backend *be;
  void *ctx;
  int count;
  char (*uuids)[BH_GPU_UUID_MAX]; /* count entries; "" where unreadable */
};

static void bh__seterr(char *err, size_t len, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void bh__seterr(char *err, size_t len, const char *fmt, ...) {
  if (!err || len == 0) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err, len, fmt, ap);
  va_end(ap);
}

/* Copies a NUL-terminated string into (buf, len): its length or -ERANGE. */
static int bh__copy_out(const char *s, char *buf, size_t len) {
  size_t n = strlen(s);
  if (n + 1 > len) return -ERANGE;
  memcpy(buf, s, n + 1);
  return n > INT32_MAX ? INT32_MAX : (int)n;
}

int bh_gpu_open_backend(bh_gpu **out, const struct bh_gpu_backend *be, void *ctx, char *err,
                        size_t errlen) {
  bh_gpu *g = NULL;
  int rc, n;
  if (err && errlen) err[0] = 0;
  if (!out || !be || !be->count || !be->uuid || !be->device_name || !be->memory || !be->close)
    return -EINVAL; /* ctx cannot be consumed through a backend we cannot trust */
  *out = NULL;
  n = be->count(ctx);
  if (n < 0) {
    rc = n;
    bh__seterr(err, errlen, "%s: reading the device count failed: %s", be->name, bh_strerror(rc));
    goto fail;
  }
  g = calloc(1, sizeof *g);
  if (!g || (n && !(g->uuids = calloc((size_t)n, sizeof *g->uuids)))) {
    rc = -ENOMEM;
    goto fail;
  }
  g->be = be;
  g->ctx = ctx;
  g->count = n;
  for (int i = 0; i < n; i++)
    if (be->uuid(ctx, i, g->uuids[i], sizeof g->uuids[i]) < 0) g->uuids[i][0] = 0;
  *out = g;
  return 0;
fail:
  if (g) free(g->uuids);
  free(g);
  be->close(ctx);
  return rc;
}

void bh_gpu_close(bh_gpu *g) {
  if (!g) return;
  g->be->close(g->ctx);
  free(g->uuids);
  free(g);
}

const char *bh_gpu_backend_name(const bh_gpu *g) { return g ? g->be->name : NULL; }

int bh_gpu_count(const bh_gpu *g) { return g ? g->count : -EINVAL; }

/* 0 when index names a device the backend accepts (indices >= count only
 * exist through lookup_uuid; the backend checks those). */
static int bh__gpu_index_ok(const bh_gpu *g, int index) {
  if (index < 0) return -BH_ENODEVICE;
  if (index < g->count) return 0;
  return g->be->lookup_uuid ? 0 : -BH_ENODEVICE;
}

int bh_gpu_uuid(bh_gpu *g, int index, char *uuid, size_t len) {
  if (!g || !uuid || len == 0) return -EINVAL;
  int rc = bh__gpu_index_ok(g, index);
  if (rc < 0) return rc;
  if (index < g->count && g->uuids[index][0]) return bh__copy_out(g->uuids[index], uuid, len);
  char tmp[BH_GPU_UUID_MAX];
  rc = g->be->uuid(g->ctx, index, tmp, sizeof tmp);
  return rc < 0 ? rc : bh__copy_out(tmp, uuid, len);
}

int bh_gpu_name(bh_gpu *g, int index, char *name, size_t len) {
  if (!g || !name || len == 0) return -EINVAL;
  int rc = bh__gpu_index_ok(g, index);
  if (rc < 0) return rc;
  char tmp[BH_GPU_NAME_MAX];
  rc = g->be->device_name(g->ctx, index, tmp, sizeof tmp);
  return rc < 0 ? rc : bh__copy_out(tmp, name, len);
}

int bh_gpu_find(bh_gpu *g, const char *s) {
  if (!g || !s || !s[0]) return -EINVAL;
  size_t n = strlen(s);
  int found = -1;
  for (int i = 0; i < g->count; i++) {
    if (!g->uuids[i][0] || strncasecmp(g->uuids[i], s, n) != 0) continue;
    if (found >= 0) return -ENOTUNIQ;
    found = i;
  }
  if (found >= 0) return found;
  /* MIG instances are not in the index enumeration; only a full UUID can
   * be looked up. */
  if (g->be->lookup_uuid && strncasecmp(s, "MIG-", 4) == 0) return g->be->lookup_uuid(g->ctx, s);
  return -BH_ENODEVICE;
}

/* One CUDA_VISIBLE_DEVICES entry (s, n), blanks trimmed, to a device
 * index, or < 0 when the entry is invalid. */
static int bh__cvd_entry(bh_gpu *g, const char *s, size_t n) {
  while (n && isspace((unsigned char)*s)) s++, n--;
  while (n && isspace((unsigned char)s[n - 1])) n--;
  if (n == 0) return -BH_ENODEVICE;
  if (n >= 4 && (strncasecmp(s, "GPU-", 4) == 0 || strncasecmp(s, "MIG-", 4) == 0)) {
    char buf[BH_GPU_UUID_MAX];
    if (n >= sizeof buf) return -BH_ENODEVICE;
    memcpy(buf, s, n);
    buf[n] = 0;
    return bh_gpu_find(g, buf);
  }
  long v = 0;
  for (size_t i = 0; i < n; i++) {
    if (s[i] < '0' || s[i] > '9') return -BH_ENODEVICE;
    v = v * 10 + (s[i] - '0');
    if (v >= g->count) return -BH_ENODEVICE; /* also bounds v */
  }
  return (int)v;
}

#define BH__CVD_MAX 256 /* visible devices considered: far beyond any machine */

int bh_gpu_visible(bh_gpu *g, const char *cvd, int ordinal) {
  if (!g) return -EINVAL;
  if (ordinal < 0) return -BH_ENODEVICE;
  if (!cvd) return ordinal < g->count ? ordinal : -BH_ENODEVICE;
  if (ordinal >= BH__CVD_MAX) return -BH_ENODEVICE;
  int seen[BH__CVD_MAX];
  int n_seen = 0;
  const char *p = cvd;
  while (*p) {
    const char *comma = strchr(p, ',');
    size_t len = comma ? (size_t)(comma - p) : strlen(p);
    int idx = bh__cvd_entry(g, p, len);
    if (idx < 0) break; /* an invalid entry ends the list */
    for (int i = 0; i < n_seen; i++)
      if (seen[i] == idx) return -BH_ENODEVICE; /* a repeat is invalid too */
    if (n_seen == ordinal) return idx;
    seen[n_seen++] = idx;
    if (!comma) break;
    p = comma + 1;
  }
  return -BH_ENODEVICE;
}

int bh_gpu_memory_read(bh_gpu *g, int index, bh_gpu_memory *out) {
  if (!out) return -EINVAL;
  memset(out, 0, sizeof *out);
  if (!g) return -EINVAL;
  int rc = bh__gpu_index_ok(g, index);
  if (rc == 0) rc = g->be->memory(g->ctx, index, out);
  if (rc < 0) {
    memset(out, 0, sizeof *out);
    return rc;
  }
  out->valid = 1;
  return 0;
}

int bh_gpu_process_used(bh_gpu *g, int index, pid_t pid, uint64_t *bytes) {
  if (!g || !bytes || pid <= 0) return -EINVAL;
  int rc = bh__gpu_index_ok(g, index);
  if (rc < 0) return rc;
  if (!g->be->process_used) return -ENOTSUP;
  uint64_t v = 0;
  rc = g->be->process_used(g->ctx, index, pid, &v);
  if (rc < 0) return rc;
  *bytes = v;
  return 0;
}

/* ---------------------------------------------------------------- NVML */

/* NVML's types, declared from its documented ABI. */
typedef int bh__nvml_rc;
typedef struct bh__nvml_device_st *bh__nvml_dev;
typedef struct {
  unsigned long long total, free, used;
} bh__nvml_memory_v1;
typedef struct {
  unsigned int version;
  unsigned long long total, reserved, free, used;
} bh__nvml_memory_v2;
#define BH__NVML_MEMORY_V2 ((unsigned int)(sizeof(bh__nvml_memory_v2) | 2u << 24))
/* nvmlDeviceGetComputeRunningProcesses (plain) fills v1 entries; _v3 fills
 * the four-field entries its header calls nvmlProcessInfo_t. */
typedef struct {
  unsigned int pid;
  unsigned long long used_gpu_memory;
} bh__nvml_proc_v1;
typedef struct {
  unsigned int pid;
  unsigned long long used_gpu_memory;
  unsigned int gpu_instance_id, compute_instance_id;
} bh__nvml_proc_v2;

enum {
  BH__NVML_SUCCESS = 0,
  BH__NVML_ERROR_UNINITIALIZED = 1,
  BH__NVML_ERROR_INVALID_ARGUMENT = 2,
  BH__NVML_ERROR_NOT_SUPPORTED = 3,
  BH__NVML_ERROR_NO_PERMISSION = 4,
  BH__NVML_ERROR_NOT_FOUND = 6,
  BH__NVML_ERROR_INSUFFICIENT_SIZE = 7,
  BH__NVML_ERROR_FUNCTION_NOT_FOUND = 13,
  BH__NVML_ERROR_MEMORY = 20,
  BH__NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25,
  BH__NVML_ERROR_GPU_NOT_FOUND = 28,
};
#define BH__NVML_VALUE_NOT_AVAILABLE (~0ULL)
#define BH__NVML_EXTRA_MAX 64 /* MIG instances looked up by UUID */

struct bh__nvml {
  void *dl;
  const char *init_name; /* which init symbol resolved, for messages */
  /* required */
  bh__nvml_rc (*init)(void);
  bh__nvml_rc (*shutdown)(void);
  bh__nvml_rc (*get_count)(unsigned int *n);
  bh__nvml_rc (*handle_by_index)(unsigned int i, bh__nvml_dev *h);
  bh__nvml_rc (*get_uuid)(bh__nvml_dev h, char *buf, unsigned int len);
  bh__nvml_rc (*get_name)(bh__nvml_dev h, char *buf, unsigned int len);
  /* optional (NULL-checked); at least one memory call is required */
  bh__nvml_rc (*memory_v2)(bh__nvml_dev h, bh__nvml_memory_v2 *m);
  bh__nvml_rc (*memory_v1)(bh__nvml_dev h, bh__nvml_memory_v1 *m);
  bh__nvml_rc (*handle_by_uuid)(const char *uuid, bh__nvml_dev *h);
  const char *(*error_string)(bh__nvml_rc rc);
  bh__nvml_rc (*procs_v3)(bh__nvml_dev h, unsigned int *n, bh__nvml_proc_v2 *out);
  bh__nvml_rc (*procs_v1)(bh__nvml_dev h, unsigned int *n, bh__nvml_proc_v1 *out);

  atomic_int memory_v2_off; /* the driver refused the v2 call: use v1 */
  int initialized;
  int count;
  bh__nvml_dev *handles;   /* count entries; NULL where the call failed */
  bh__nvml_rc *handle_rc;  /* why it failed */
  pthread_mutex_t mu;      /* serializes appends to extra[] */
  struct {
    bh__nvml_dev h;
    char uuid[BH_GPU_UUID_MAX];
  } extra[BH__NVML_EXTRA_MAX];
  atomic_int n_extra;
};

/* The symbol table: names tried in order, the slot, and whether open
 * fails without it. */
static const struct {
  const char *names[2];
  size_t offset;
  int required;
} bh__nvml_syms[] = {
#define BH__SYM(field, n1, n2, req) {{n1, n2}, offsetof(struct bh__nvml, field), req}
    BH__SYM(init, "nvmlInit_v2", "nvmlInit", 1),
    BH__SYM(shutdown, "nvmlShutdown", NULL, 1),
    BH__SYM(get_count, "nvmlDeviceGetCount_v2", "nvmlDeviceGetCount", 1),
    BH__SYM(handle_by_index, "nvmlDeviceGetHandleByIndex_v2", "nvmlDeviceGetHandleByIndex", 1),
    BH__SYM(get_uuid, "nvmlDeviceGetUUID", NULL, 1),
    BH__SYM(get_name, "nvmlDeviceGetName", NULL, 1),
    BH__SYM(memory_v2, "nvmlDeviceGetMemoryInfo_v2", NULL, 0),
    BH__SYM(memory_v1, "nvmlDeviceGetMemoryInfo", NULL, 0),
    BH__SYM(handle_by_uuid, "nvmlDeviceGetHandleByUUID", NULL, 0),
    BH__SYM(error_string, "nvmlErrorString", NULL, 0),
    BH__SYM(procs_v3, "nvmlDeviceGetComputeRunningProcesses_v3", NULL, 0),
    BH__SYM(procs_v1, "nvmlDeviceGetComputeRunningProcesses", NULL, 0),
#undef BH__SYM
};

static int bh__nvml_err(bh__nvml_rc rc) {
  switch (rc) {
  case BH__NVML_SUCCESS: return 0;
  case BH__NVML_ERROR_INVALID_ARGUMENT: return -EINVAL;
  case BH__NVML_ERROR_NOT_SUPPORTED: return -ENOTSUP;
  case BH__NVML_ERROR_NO_PERMISSION: return -EACCES;
  case BH__NVML_ERROR_NOT_FOUND:
  case BH__NVML_ERROR_GPU_NOT_FOUND: return -BH_ENODEVICE;
  case BH__NVML_ERROR_MEMORY: return -ENOMEM;
  default: return -BH_ENVML; /* GPU lost, timeout, driver/library mismatch, ... */
  }
}

static const char *bh__nvml_str(const struct bh__nvml *n, bh__nvml_rc rc) {
  const char *s = n->error_string ? n->error_string(rc) : NULL;
  return s ? s : "unknown NVML error";
}

/* The handle of index i (a physical device or an extra), or NULL with
 * *rc set. */
static bh__nvml_dev bh__nvml_handle(struct bh__nvml *n, int i, int *rc) {
  if (i >= 0 && i < n->count) {
    if (!n->handles[i]) *rc = bh__nvml_err(n->handle_rc[i]);
    return n->handles[i];
  }
  int k = i - n->count;
  if (i >= 0 && k < atomic_load_explicit(&n->n_extra, memory_order_acquire))
    return n->extra[k].h;
  *rc = -BH_ENODEVICE;
  return NULL;
}

static int bh__nvml_count(void *ctx) { return ((struct bh__nvml *)ctx)->count; }

/* A device's string from one of NVML's getters (UUID, name), through a
 * buffer of `cap` bytes (the longest NVML documents for it). */
static int bh__nvml_string(struct bh__nvml *n, int i, bh__nvml_rc (*get)(bh__nvml_dev, char *, unsigned int),
                           size_t cap, char *buf, size_t len) {
  int rc = 0;
  bh__nvml_dev h = bh__nvml_handle(n, i, &rc);
  if (!h) return rc;
  char tmp[BH_GPU_UUID_MAX > BH_GPU_NAME_MAX ? BH_GPU_UUID_MAX : BH_GPU_NAME_MAX] = {0};
  if (cap > sizeof tmp) cap = sizeof tmp;
  rc = bh__nvml_err(get(h, tmp, (unsigned int)cap));
  if (rc < 0) return rc;
  tmp[cap - 1] = 0;
  return bh__copy_out(tmp, buf, len);
}

static int bh__nvml_uuid(void *ctx, int i, char *buf, size_t len) {
  struct bh__nvml *n = ctx;
  return bh__nvml_string(n, i, n->get_uuid, BH_GPU_UUID_MAX, buf, len);
}

static int bh__nvml_name(void *ctx, int i, char *buf, size_t len) {
  struct bh__nvml *n = ctx;
  return bh__nvml_string(n, i, n->get_name, BH_GPU_NAME_MAX, buf, len);
}

static int bh__nvml_memory(void *ctx, int i, bh_gpu_memory *out) {
  struct bh__nvml *n = ctx;
  int rc = 0;
  bh__nvml_dev h = bh__nvml_handle(n, i, &rc);
  if (!h) return rc;
  if (n->memory_v2 && !atomic_load_explicit(&n->memory_v2_off, memory_order_relaxed)) {
    bh__nvml_memory_v2 m = {.version = BH__NVML_MEMORY_V2};
    bh__nvml_rc r = n->memory_v2(h, &m);
    if (r == BH__NVML_SUCCESS) {
      out->total_bytes = m.total;
      out->free_bytes = m.free;
      out->used_bytes = m.used;
      out->reserved_bytes = m.reserved;
      return 0;
    }
    /* An older driver's stub or struct version: v1 from now on.  Not
     * supported on this device (a MIG instance, vGPU): v1 this time. */
    if (r == BH__NVML_ERROR_FUNCTION_NOT_FOUND || r == BH__NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
      atomic_store_explicit(&n->memory_v2_off, 1, memory_order_relaxed);
    else if (r != BH__NVML_ERROR_NOT_SUPPORTED)
      return bh__nvml_err(r);
    if (!n->memory_v1) return bh__nvml_err(r);
  }
  if (!n->memory_v1) return -ENOTSUP;
  bh__nvml_memory_v1 m = {0};
  rc = bh__nvml_err(n->memory_v1(h, &m));
  if (rc < 0) return rc;
  out->total_bytes = m.total;
  out->free_bytes = m.free;
  out->used_bytes = m.used;
  out->reserved_bytes = 0;
  return 0;
}

/* Calls one of the two process-list functions with a growing buffer and
 * sums the entries of `pid`. */
static int bh__nvml_process_used(void *ctx, int i, pid_t pid, uint64_t *bytes) {
  struct bh__nvml *n = ctx;
  int rc = 0, v3 = n->procs_v3 != NULL;
  bh__nvml_dev h = bh__nvml_handle(n, i, &rc);
  if (!h) return rc;
  if (!n->procs_v3 && !n->procs_v1) return -ENOTSUP;
  size_t esize = v3 ? sizeof(bh__nvml_proc_v2) : sizeof(bh__nvml_proc_v1);
  unsigned int cap = 64;
  void *buf = NULL;
  for (int attempt = 0;; attempt++) {
    void *nb = realloc(buf, (size_t)cap * esize);
    if (!nb) {
      rc = -ENOMEM;
      goto done;
    }
    buf = nb;
    unsigned int got = cap;
    bh__nvml_rc r = v3 ? n->procs_v3(h, &got, buf) : n->procs_v1(h, &got, buf);
    if (r == BH__NVML_ERROR_FUNCTION_NOT_FOUND && v3 && n->procs_v1) {
      v3 = 0; /* an old driver's stub: fall back to the plain call */
      esize = sizeof(bh__nvml_proc_v1);
      continue;
    }
    if (r == BH__NVML_ERROR_INSUFFICIENT_SIZE && attempt < 8 && got < (1u << 20)) {
      cap = got > cap ? got + 16 : cap * 2; /* processes come and go */
      continue;
    }
    if (r != BH__NVML_SUCCESS) {
      rc = bh__nvml_err(r);
      if (rc == -EACCES) rc = -ENODATA;
      goto done;
    }
    if (got > cap) got = cap;
    uint64_t sum = 0;
    for (unsigned int k = 0; k < got; k++) {
      unsigned int epid;
      unsigned long long used;
      if (v3) {
        const bh__nvml_proc_v2 *e = (const bh__nvml_proc_v2 *)buf + k;
        epid = e->pid, used = e->used_gpu_memory;
      } else {
        const bh__nvml_proc_v1 *e = (const bh__nvml_proc_v1 *)buf + k;
        epid = e->pid, used = e->used_gpu_memory;
      }
      if (epid != (unsigned int)pid) continue;
      if (used == BH__NVML_VALUE_NOT_AVAILABLE) {
        rc = -ENODATA;
        goto done;
      }
      sum += used;
    }
    *bytes = sum;
    rc = 0;
    goto done;
  }
done:
  free(buf);
  return rc;
}

static int bh__nvml_lookup_uuid(void *ctx, const char *uuid) {
  struct bh__nvml *n = ctx;
  int rc;
  if (!n->handle_by_uuid) return -BH_ENODEVICE;
  pthread_mutex_lock(&n->mu);
  int k_max = atomic_load_explicit(&n->n_extra, memory_order_relaxed);
  for (int k = 0; k < k_max; k++)
    if (strcasecmp(n->extra[k].uuid, uuid) == 0) {
      rc = n->count + k;
      goto done;
    }
  bh__nvml_dev h = NULL;
  bh__nvml_rc r = n->handle_by_uuid(uuid, &h);
  if (r == BH__NVML_ERROR_INVALID_ARGUMENT || r == BH__NVML_ERROR_NOT_FOUND) {
    rc = -BH_ENODEVICE;
    goto done;
  }
  if (r != BH__NVML_SUCCESS || !h) {
    rc = r != BH__NVML_SUCCESS ? bh__nvml_err(r) : -BH_ENVML;
    goto done;
  }
  for (int i = 0; i < n->count; i++)
    if (n->handles[i] == h) {
      rc = i;
      goto done;
    }
  if (k_max == BH__NVML_EXTRA_MAX || strlen(uuid) >= BH_GPU_UUID_MAX) {
    rc = -ENOSPC;
    goto done;
  }
  n->extra[k_max].h = h;
  snprintf(n->extra[k_max].uuid, sizeof n->extra[k_max].uuid, "%s", uuid);
  atomic_store_explicit(&n->n_extra, k_max + 1, memory_order_release);
  rc = n->count + k_max;
done:
  pthread_mutex_unlock(&n->mu);
  return rc;
}

static void bh__nvml_free(struct bh__nvml *n) {
  if (!n) return;
  if (n->initialized) n->shutdown();
  if (n->dl) dlclose(n->dl);
  pthread_mutex_destroy(&n->mu);
  free(n->handles);
  free(n->handle_rc);
  free(n);
}

static void bh__nvml_close(void *ctx) { bh__nvml_free(ctx); }

static const struct bh_gpu_backend bh__nvml_backend = {
    .name = "nvml",
    .count = bh__nvml_count,
    .uuid = bh__nvml_uuid,
    .device_name = bh__nvml_name,
    .memory = bh__nvml_memory,
    .process_used = bh__nvml_process_used,
    .lookup_uuid = bh__nvml_lookup_uuid,
    .close = bh__nvml_close,
};

/* dlopen()s the library: the given path, or the two default names.  Keeps
 * every dlerror() text in err. */
static void *bh__nvml_dlopen(const char *path, char *err, size_t errlen) {
  static const char *const defaults[] = {"libnvidia-ml.so.1", "libnvidia-ml.so"};
  char msg[1024];
  size_t used = 0;
  msg[0] = 0;
  const char *const *names = path ? &path : defaults;
  size_t n_names = path ? 1 : sizeof defaults / sizeof *defaults;
  for (size_t i = 0; i < n_names; i++) {
    void *dl = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
    if (dl) return dl;
    const char *e = dlerror();
    int w = snprintf(msg + used, sizeof msg - used, "%s%s", used ? "; " : "", e ? e : names[i]);
    if (w > 0) used = (size_t)w + used >= sizeof msg ? sizeof msg - 1 : used + (size_t)w;
  }
  bh__seterr(err, errlen, "cannot load NVML: %s", msg);
  return NULL;
}

int bh_gpu_open_nvml(bh_gpu **out, const char *library_path, char *err, size_t errlen) {
  struct bh__nvml *n = NULL;
  int rc;
  if (err && errlen) err[0] = 0;
  if (!out || (library_path && !library_path[0])) return -EINVAL;
  *out = NULL;
  n = calloc(1, sizeof *n);
  if (!n) return -ENOMEM;
  pthread_mutex_init(&n->mu, NULL);
  n->dl = bh__nvml_dlopen(library_path, err, errlen);
  if (!n->dl) {
    rc = -BH_ENODRIVER;
    goto fail;
  }
  for (size_t s = 0; s < sizeof bh__nvml_syms / sizeof *bh__nvml_syms; s++) {
    void *p = NULL;
    const char *e = NULL;
    for (int k = 0; k < 2 && !p && bh__nvml_syms[s].names[k]; k++) {
      dlerror();
      p = dlsym(n->dl, bh__nvml_syms[s].names[k]);
      if (!p && !e) e = dlerror(); /* the preferred name's failure */
      if (p && bh__nvml_syms[s].offset == offsetof(struct bh__nvml, init))
        n->init_name = bh__nvml_syms[s].names[k];
    }
    if (!p && bh__nvml_syms[s].required) {
      bh__seterr(err, errlen, "NVML library lacks %s: %s", bh__nvml_syms[s].names[0],
                 e ? e : "symbol not found");
      rc = -BH_ENODRIVER;
      goto fail;
    }
    /* POSIX guarantees a function pointer fits in (and round-trips
     * through) the void * dlsym returns. */
    memcpy((char *)n + bh__nvml_syms[s].offset, &p, sizeof p);
  }
  if (!n->memory_v1 && !n->memory_v2) {
    bh__seterr(err, errlen, "NVML library lacks nvmlDeviceGetMemoryInfo (and its _v2)");
    rc = -BH_ENODRIVER;
    goto fail;
  }
  bh__nvml_rc r = n->init();
  if (r != BH__NVML_SUCCESS) {
    bh__seterr(err, errlen, "%s failed: %s (NVML error %d)", n->init_name, bh__nvml_str(n, r), r);
    rc = -BH_ENODRIVER;
    goto fail;
  }
  n->initialized = 1;
  unsigned int count = 0;
  r = n->get_count(&count);
  if (r != BH__NVML_SUCCESS) {
    bh__seterr(err, errlen, "nvmlDeviceGetCount failed: %s (NVML error %d)", bh__nvml_str(n, r), r);
    rc = -BH_ENVML;
    goto fail;
  }
  if (count > 4096) { /* a corrupt answer, not a machine */
    bh__seterr(err, errlen, "nvmlDeviceGetCount reported %u devices", count);
    rc = -BH_ENVML;
    goto fail;
  }
  n->count = (int)count;
  if (count) {
    n->handles = calloc(count, sizeof *n->handles);
    n->handle_rc = calloc(count, sizeof *n->handle_rc);
    if (!n->handles || !n->handle_rc) {
      rc = -ENOMEM;
      goto fail;
    }
  }
  for (unsigned int i = 0; i < count; i++) {
    bh__nvml_dev h = NULL;
    r = n->handle_by_index(i, &h);
    /* A device we may not touch (NO_PERMISSION) stays in the list so that
     * indices keep NVML's meaning; its calls fail with the saved code. */
    n->handles[i] = r == BH__NVML_SUCCESS ? h : NULL;
    n->handle_rc[i] = r == BH__NVML_SUCCESS && !h ? BH__NVML_ERROR_NOT_FOUND : r;
  }
  return bh_gpu_open_backend(out, &bh__nvml_backend, n, err, errlen);
fail:
  bh__nvml_free(n);
  return rc;
}
