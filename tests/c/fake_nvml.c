/*
 * fake_nvml.c -- a stand-in for the driver's libnvidia-ml.so.1, built into
 * the build tree as tests/c/fake_nvml/libnvidia-ml.so.1 so the GPU probe
 * can be tested on a machine without a GPU.  Same symbol names, calling
 * conventions and struct layouts as NVML (declared here; no NVIDIA header).
 *
 * What it reports comes from a small text file named by the environment
 * variable BH_FAKE_NVML, read again whenever the file changes (inode, size
 * or mtime differ from the last parse; a test replaces the file with
 * rename() so each version is a new inode).  Without the variable or the
 * file, nvmlInit fails with NVML_ERROR_DRIVER_NOT_LOADED, like a machine
 * with the library but no kernel driver.  Lines ('#' starts a comment):
 *
 *   device <uuid> "<name>" total=N free=N used=N [reserved=N]
 *   mig <uuid> "<name>" total=N free=N used=N   (reachable by UUID only)
 *   process <device index> pid=N used=N|na    (a compute process)
 *   fail <symbol>=<nvml error code>           (that call fails)
 *
 * The per-call cost is one stat() and a mutex: the probe's read path is
 * benchmarked through it.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define API __attribute__((visibility("default")))

typedef int nvmlReturn_t;
typedef struct fake_dev *nvmlDevice_t;
typedef struct {
  unsigned long long total, free, used;
} nvmlMemory_t;
typedef struct {
  unsigned int version;
  unsigned long long total, reserved, free, used;
} nvmlMemory_v2_t;
typedef struct {
  unsigned int pid;
  unsigned long long usedGpuMemory;
} nvmlProcessInfo_v1_t;
typedef struct {
  unsigned int pid;
  unsigned long long usedGpuMemory;
  unsigned int gpuInstanceId, computeInstanceId;
} nvmlProcessInfo_v2_t;

#define MEMORY_V2_VERSION ((unsigned int)(sizeof(nvmlMemory_v2_t) | 2u << 24))
#define NOT_AVAILABLE (~0ULL)

enum {
  OK = 0,
  E_UNINITIALIZED = 1,
  E_INVALID_ARGUMENT = 2,
  E_INSUFFICIENT_SIZE = 7,
  E_DRIVER_NOT_LOADED = 9,
  E_NOT_FOUND = 6,
  E_VERSION_MISMATCH = 25,
};

#define MAX_DEV 16
#define MAX_PROC 256
#define MAX_FAIL 32

typedef struct {
  char uuid[96], name[96];
  unsigned long long total, free, used, reserved;
} fake_dev;

static struct {
  pthread_mutex_t mu;
  int inits;
  int loaded; /* a state file was parsed */
  struct stat seen;
  fake_dev dev[MAX_DEV], mig[MAX_DEV];
  int n_dev, n_mig;
  struct {
    int dev;
    unsigned int pid;
    unsigned long long used;
  } proc[MAX_PROC];
  int n_proc;
  struct {
    char sym[64];
    int code;
  } fail[MAX_FAIL];
  int n_fail;
} S = {.mu = PTHREAD_MUTEX_INITIALIZER};

static unsigned long long kv(const char *line, const char *key, unsigned long long dflt) {
  char pat[32];
  snprintf(pat, sizeof pat, " %s=", key);
  const char *p = strstr(line, pat);
  if (!p) return dflt;
  p += strlen(pat);
  if (strncmp(p, "na", 2) == 0) return NOT_AVAILABLE;
  return strtoull(p, NULL, 0);
}

static void parse_device(const char *line, fake_dev *d) {
  memset(d, 0, sizeof *d);
  sscanf(line, "%*s %95s", d->uuid);
  const char *q1 = strchr(line, '"'), *q2 = q1 ? strchr(q1 + 1, '"') : NULL;
  if (q1 && q2) snprintf(d->name, sizeof d->name, "%.*s", (int)(q2 - q1 - 1), q1 + 1);
  d->total = kv(line, "total", 0);
  d->free = kv(line, "free", 0);
  d->used = kv(line, "used", 0);
  d->reserved = kv(line, "reserved", 0);
}

/* Re-reads the state file if it changed.  Called with S.mu held. */
static void refresh(void) {
  const char *path = getenv("BH_FAKE_NVML");
  struct stat st;
  if (!path || stat(path, &st) != 0) {
    S.loaded = 0;
    return;
  }
  if (S.loaded && st.st_ino == S.seen.st_ino && st.st_dev == S.seen.st_dev &&
      st.st_size == S.seen.st_size && st.st_mtim.tv_sec == S.seen.st_mtim.tv_sec &&
      st.st_mtim.tv_nsec == S.seen.st_mtim.tv_nsec)
    return;
  FILE *f = fopen(path, "re");
  if (!f) {
    S.loaded = 0;
    return;
  }
  S.n_dev = S.n_mig = S.n_proc = S.n_fail = 0;
  char line[512];
  while (fgets(line, sizeof line, f)) {
    if (strncmp(line, "device ", 7) == 0 && S.n_dev < MAX_DEV) {
      parse_device(line, &S.dev[S.n_dev++]);
    } else if (strncmp(line, "mig ", 4) == 0 && S.n_mig < MAX_DEV) {
      parse_device(line, &S.mig[S.n_mig++]);
    } else if (strncmp(line, "process ", 8) == 0 && S.n_proc < MAX_PROC) {
      S.proc[S.n_proc].dev = atoi(line + 8);
      S.proc[S.n_proc].pid = (unsigned int)kv(line, "pid", 0);
      S.proc[S.n_proc].used = kv(line, "used", 0);
      S.n_proc++;
    } else if (strncmp(line, "fail ", 5) == 0 && S.n_fail < MAX_FAIL) {
      char *eq = strchr(line, '=');
      if (!eq) continue;
      snprintf(S.fail[S.n_fail].sym, sizeof S.fail[S.n_fail].sym, "%.*s", (int)(eq - line - 5),
               line + 5);
      S.fail[S.n_fail].code = atoi(eq + 1);
      S.n_fail++;
    }
  }
  fclose(f);
  S.seen = st;
  S.loaded = 1;
}

/* Entry to every call but init: refreshes, then the configured failure of
 * `sym` or UNINITIALIZED.  Returns with S.mu held when it returns OK. */
static nvmlReturn_t enter(const char *sym) {
  pthread_mutex_lock(&S.mu);
  if (S.inits == 0) {
    pthread_mutex_unlock(&S.mu);
    return E_UNINITIALIZED;
  }
  refresh();
  for (int i = 0; i < S.n_fail; i++)
    if (strcmp(S.fail[i].sym, sym) == 0) {
      int code = S.fail[i].code;
      pthread_mutex_unlock(&S.mu);
      return code;
    }
  return OK;
}

static nvmlReturn_t leave(nvmlReturn_t rc) {
  pthread_mutex_unlock(&S.mu);
  return rc;
}

/* A handle's device: physical devices are 0x100 + i, MIG ones 0x1000 + j. */
static fake_dev *dev_of(nvmlDevice_t h) {
  uintptr_t v = (uintptr_t)h;
  if (v >= 0x100 && v < 0x100 + (uintptr_t)S.n_dev) return &S.dev[v - 0x100];
  if (v >= 0x1000 && v < 0x1000 + (uintptr_t)S.n_mig) return &S.mig[v - 0x1000];
  return NULL;
}

static nvmlReturn_t init_common(const char *sym) {
  pthread_mutex_lock(&S.mu);
  refresh();
  nvmlReturn_t rc = OK;
  if (!S.loaded) rc = E_DRIVER_NOT_LOADED;
  for (int i = 0; rc == OK && i < S.n_fail; i++)
    if (strcmp(S.fail[i].sym, sym) == 0) rc = S.fail[i].code;
  if (rc == OK) S.inits++;
  pthread_mutex_unlock(&S.mu);
  return rc;
}

API nvmlReturn_t nvmlInit_v2(void) { return init_common("nvmlInit_v2"); }
API nvmlReturn_t nvmlInit(void) { return init_common("nvmlInit"); }

API nvmlReturn_t nvmlShutdown(void) {
  pthread_mutex_lock(&S.mu);
  nvmlReturn_t rc = S.inits > 0 ? OK : E_UNINITIALIZED;
  if (S.inits > 0) S.inits--;
  pthread_mutex_unlock(&S.mu);
  return rc;
}

API const char *nvmlErrorString(nvmlReturn_t rc) {
  switch (rc) {
  case 0: return "Success";
  case 1: return "Uninitialized";
  case 2: return "Invalid Argument";
  case 3: return "Not Supported";
  case 4: return "Insufficient Permissions";
  case 6: return "Not Found";
  case 7: return "Insufficient Size";
  case 9: return "Driver Not Loaded";
  case 13: return "Function Not Found";
  case 15: return "GPU is lost";
  case 25: return "Argument version mismatch";
  default: return "Unknown Error";
  }
}

static nvmlReturn_t get_count(const char *sym, unsigned int *n) {
  nvmlReturn_t rc = enter(sym);
  if (rc != OK) return rc;
  if (!n) return leave(E_INVALID_ARGUMENT);
  *n = (unsigned int)S.n_dev;
  return leave(OK);
}

API nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *n) { return get_count("nvmlDeviceGetCount_v2", n); }
API nvmlReturn_t nvmlDeviceGetCount(unsigned int *n) { return get_count("nvmlDeviceGetCount", n); }

static nvmlReturn_t by_index(const char *sym, unsigned int i, nvmlDevice_t *h) {
  nvmlReturn_t rc = enter(sym);
  if (rc != OK) return rc;
  if (!h || i >= (unsigned int)S.n_dev) return leave(E_INVALID_ARGUMENT);
  *h = (nvmlDevice_t)(uintptr_t)(0x100 + i);
  return leave(OK);
}

API nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int i, nvmlDevice_t *h) {
  return by_index("nvmlDeviceGetHandleByIndex_v2", i, h);
}
API nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int i, nvmlDevice_t *h) {
  return by_index("nvmlDeviceGetHandleByIndex", i, h);
}

API nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *h) {
  nvmlReturn_t rc = enter("nvmlDeviceGetHandleByUUID");
  if (rc != OK) return rc;
  if (!uuid || !h) return leave(E_INVALID_ARGUMENT);
  for (int i = 0; i < S.n_dev; i++)
    if (strcmp(S.dev[i].uuid, uuid) == 0) {
      *h = (nvmlDevice_t)(uintptr_t)(0x100 + i);
      return leave(OK);
    }
  for (int i = 0; i < S.n_mig; i++)
    if (strcmp(S.mig[i].uuid, uuid) == 0) {
      *h = (nvmlDevice_t)(uintptr_t)(0x1000 + i);
      return leave(OK);
    }
  return leave(E_NOT_FOUND);
}

static nvmlReturn_t copy_str(const char *s, char *buf, unsigned int len) {
  if (!buf) return E_INVALID_ARGUMENT;
  if (strlen(s) + 1 > len) return E_INSUFFICIENT_SIZE;
  memcpy(buf, s, strlen(s) + 1);
  return OK;
}

API nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t h, char *buf, unsigned int len) {
  nvmlReturn_t rc = enter("nvmlDeviceGetUUID");
  if (rc != OK) return rc;
  fake_dev *d = dev_of(h);
  return leave(d ? copy_str(d->uuid, buf, len) : E_INVALID_ARGUMENT);
}

API nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t h, char *buf, unsigned int len) {
  nvmlReturn_t rc = enter("nvmlDeviceGetName");
  if (rc != OK) return rc;
  fake_dev *d = dev_of(h);
  return leave(d ? copy_str(d->name, buf, len) : E_INVALID_ARGUMENT);
}

API nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t h, nvmlMemory_v2_t *m) {
  nvmlReturn_t rc = enter("nvmlDeviceGetMemoryInfo_v2");
  if (rc != OK) return rc;
  fake_dev *d = dev_of(h);
  if (!d || !m) return leave(E_INVALID_ARGUMENT);
  if (m->version != MEMORY_V2_VERSION) return leave(E_VERSION_MISMATCH);
  m->total = d->total;
  m->reserved = d->reserved;
  m->free = d->free;
  m->used = d->used;
  return leave(OK);
}

API nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t h, nvmlMemory_t *m) {
  nvmlReturn_t rc = enter("nvmlDeviceGetMemoryInfo");
  if (rc != OK) return rc;
  fake_dev *d = dev_of(h);
  if (!d || !m) return leave(E_INVALID_ARGUMENT);
  m->total = d->total;
  m->free = d->free;
  m->used = d->used + d->reserved; /* v1 counts the reservation as used */
  return leave(OK);
}

/* Fills up to *n entries of esize bytes (v1 or v2 layout) for device h. */
static nvmlReturn_t procs(const char *sym, nvmlDevice_t h, unsigned int *n, void *out, int v2) {
  nvmlReturn_t rc = enter(sym);
  if (rc != OK) return rc;
  if (!n || (uintptr_t)h < 0x100 || (uintptr_t)h >= 0x100 + (uintptr_t)S.n_dev)
    return leave(E_INVALID_ARGUMENT);
  int dev = (int)((uintptr_t)h - 0x100);
  unsigned int want = 0;
  for (int i = 0; i < S.n_proc; i++) want += S.proc[i].dev == dev;
  if (want > *n || (want && !out)) {
    *n = want;
    return leave(E_INSUFFICIENT_SIZE);
  }
  unsigned int k = 0;
  for (int i = 0; i < S.n_proc; i++) {
    if (S.proc[i].dev != dev) continue;
    if (v2) {
      nvmlProcessInfo_v2_t *e = (nvmlProcessInfo_v2_t *)out + k;
      e->pid = S.proc[i].pid;
      e->usedGpuMemory = S.proc[i].used;
      e->gpuInstanceId = e->computeInstanceId = 0xffffffffu;
    } else {
      nvmlProcessInfo_v1_t *e = (nvmlProcessInfo_v1_t *)out + k;
      e->pid = S.proc[i].pid;
      e->usedGpuMemory = S.proc[i].used;
    }
    k++;
  }
  *n = k;
  return leave(OK);
}

API nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t h, unsigned int *n,
                                                          nvmlProcessInfo_v2_t *out) {
  return procs("nvmlDeviceGetComputeRunningProcesses_v3", h, n, out, 1);
}
API nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t h, unsigned int *n,
                                                       nvmlProcessInfo_v1_t *out) {
  return procs("nvmlDeviceGetComputeRunningProcesses", h, n, out, 0);
}
