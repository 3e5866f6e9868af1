/*
 * gpu-check.c -- `make gpu-check`: bulkhead's memory layer against a real
 * NVIDIA GPU, in C only.  The driver's libcuda.so.1 and NVML are dlopen'ed
 * (no torch, no CUDA toolkit, no NVIDIA header: the few CUDA driver API
 * types and calls are declared below with the driver's ABI).
 *
 * Flow.  The parent loads libcuda and NVML; a machine without either, or
 * without a CUDA device, is told "nothing to check" and exits 0.  CUDA
 * device 0 (CUDA applies CUDA_VISIBLE_DEVICES itself) is resolved to an
 * NVML device by its UUID, never by index.  The parent creates a context
 * of its own (for cuMemGetInfo, the "blind" free figure), opens a private
 * ledger in a fresh temporary directory and joins it as host, then starts
 * --workers copies of this binary with --worker through posix_spawn (a
 * fresh exec: CUDA state does not survive fork).  A worker talks to the
 * parent over its stdin (commands) and stdout (one-line reports):
 *
 *   worker: cuInit, context on the device, join ledger   -> "ready"
 *   parent: 'a'  worker: cuMemAlloc one step, publish held_bytes in its
 *                ledger record                           -> "held <bytes>"
 *   parent: 'q' (or EOF)  worker: free all, leave        -> "bye", exit 0
 *
 * Everything is in lockstep, so each change NVML shows is one known event.
 * After each worker's "ready" the parent reads NVML free: the drop is one
 * CUDA context's cost, the largest of them sets the tolerance.  After each
 * step the parent checks
 *   (a) NVML's device-wide drop equals the bytes allocated, within one
 *       context + 2 MiB (and the total drop, within one context + 2 MiB a
 *       step);
 *   (b) the ledger's held_bytes summed over this run's worker records
 *       equals the bytes allocated, exactly;
 *   (c) bh_policy_ask_target(need, blind_free, 0, true_free, 1) - need,
 *       blind_free from the parent's cuMemGetInfo and true_free from NVML,
 *       is within one context of 0 (both are device-wide on Linux).
 * Exit 0 when every check passes, 1 naming what failed (or any runtime
 * error, or the --timeout deadline: workers are killed), 2 for usage.
 * Workers are always reaped and the temporary ledger removed.
 */
#include "bulkhead/ledger.h"
#include "bulkhead/policy.h"
#include "bulkhead/probe.h"

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

/* ---------------------------------------------- CUDA driver API, by hand */

typedef int CUresult; /* 0 == CUDA_SUCCESS */
typedef int CUdevice;
typedef struct CUctx_st *CUcontext;
typedef unsigned long long CUdeviceptr;
typedef struct { unsigned char bytes[16]; } CUuuid;

/* cuInit results that mean "no usable GPU here", not "broken". */
#define CU_STUB_LIBRARY 34
#define CU_INSUFFICIENT_DRIVER 35
#define CU_NO_DEVICE 100
#define CU_SYSTEM_DRIVER_MISMATCH 803

static struct {
  void *lib;
  CUresult (*Init)(unsigned);
  CUresult (*DeviceGetCount)(int *);
  CUresult (*DeviceGet)(CUdevice *, int);
  CUresult (*DeviceGetUuid)(CUuuid *, CUdevice);
  CUresult (*CtxCreate)(CUcontext *, unsigned, CUdevice);
  CUresult (*CtxDestroy)(CUcontext);
  CUresult (*MemAlloc)(CUdeviceptr *, size_t);
  CUresult (*MemFree)(CUdeviceptr);
  CUresult (*MemGetInfo)(size_t *, size_t *);
  CUresult (*GetErrorString)(CUresult, const char **); /* optional */
} cu;

/* dlsym of `name`_v2, then `name`. */
static void *cu_sym(const char *name) {
  char v2[64];
  snprintf(v2, sizeof v2, "%s_v2", name);
  void *p = dlsym(cu.lib, v2);
  return p ? p : dlsym(cu.lib, name);
}

/* Loads libcuda (`path`, or libcuda.so.1 then libcuda.so).  0, or -1 with
 * the reason in why; nothing stays loaded on failure. */
static int cu_load(const char *path, char *why, size_t n) {
  const char *name = path ? path : "libcuda.so.1";
  cu.lib = dlopen(name, RTLD_NOW | RTLD_LOCAL);
  if (!cu.lib) snprintf(why, n, "%s: %s", name, dlerror());
  if (!cu.lib && !path) cu.lib = dlopen("libcuda.so", RTLD_NOW | RTLD_LOCAL);
  if (!cu.lib) return -1;
#define CU_REQ(field, sym)                                                     \
  if (!(*(void **)&cu.field = cu_sym(sym))) {                                  \
    snprintf(why, n, "%s: no symbol %s", name, sym);                           \
    goto fail;                                                                 \
  }
  CU_REQ(Init, "cuInit") CU_REQ(DeviceGetCount, "cuDeviceGetCount")
  CU_REQ(DeviceGet, "cuDeviceGet") CU_REQ(DeviceGetUuid, "cuDeviceGetUuid")
  CU_REQ(CtxCreate, "cuCtxCreate") CU_REQ(CtxDestroy, "cuCtxDestroy")
  CU_REQ(MemAlloc, "cuMemAlloc") CU_REQ(MemFree, "cuMemFree")
  CU_REQ(MemGetInfo, "cuMemGetInfo")
#undef CU_REQ
  *(void **)&cu.GetErrorString = dlsym(cu.lib, "cuGetErrorString");
  return 0;
fail:
  dlclose(cu.lib);
  cu.lib = NULL;
  return -1;
}

static const char *cu_str(CUresult rc) {
  const char *s = NULL;
  if (!cu.GetErrorString || cu.GetErrorString(rc, &s) != 0 || !s) s = "unknown CUDA error";
  return s;
}

/* Device `ordinal`'s UUID as NVML prints it, without the "GPU-"/"MIG-"
 * prefix: 8-4-4-4-12 lowercase hex.  out has room for 37 bytes. */
static CUresult cu_uuid(int ordinal, CUdevice *dev, char out[37]) {
  CUuuid u;
  CUresult rc = cu.DeviceGet(dev, ordinal);
  if (rc == 0) rc = cu.DeviceGetUuid(&u, *dev);
  if (rc != 0) return rc;
  char *p = out;
  for (int i = 0; i < 16; i++) {
    if (i == 4 || i == 6 || i == 8 || i == 10) *p++ = '-';
    p += sprintf(p, "%02x", u.bytes[i]);
  }
  return 0;
}

/* -------------------------------------------------------------- helpers */

#define MIB (1024.0 * 1024.0)
#define SLACK_BYTES (2ull << 20)

static volatile sig_atomic_t g_stop;
static void on_signal(int sig) { g_stop = sig; }

static int64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int write_all(int fd, const char *s, size_t n) {
  while (n) {
    ssize_t w = write(fd, s, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return -1;
    s += w;
    n -= (size_t)w;
  }
  return 0;
}

/* Reads one '\n'-terminated line from fd (the worker writes nothing
 * unasked, so no byte of a later line is consumed) before the deadline.
 * 0, or -ETIMEDOUT, -EINTR (a signal to stop), -EPIPE (EOF), -errno. */
static int read_line(int fd, char *buf, size_t n, int64_t deadline_ms) {
  size_t len = 0;
  for (;;) {
    int64_t left = deadline_ms - now_ms();
    if (g_stop) return -EINTR;
    if (left <= 0) return -ETIMEDOUT;
    struct pollfd p = {.fd = fd, .events = POLLIN};
    int r = poll(&p, 1, left > INT_MAX ? INT_MAX : (int)left);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return -errno;
    if (r == 0) continue;
    ssize_t got = read(fd, buf + len, n - 1 - len);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) return -errno;
    if (got == 0) return -EPIPE;
    len += (size_t)got;
    buf[len] = 0;
    char *nl = strchr(buf, '\n');
    if (nl) {
      *nl = 0;
      return 0;
    }
    if (len == n - 1) return -EMSGSIZE;
  }
}

static int parse_uint(const char *s, unsigned long lo, unsigned long hi, unsigned long *out) {
  char *end;
  errno = 0;
  unsigned long v = strtoul(s, &end, 10);
  if (errno || end == s || *end || s[0] == '-' || v < lo || v > hi) return -1;
  *out = v;
  return 0;
}

/* --------------------------------------------------------------- worker */

/* The --worker side: see the file comment.  Reports on stdout, errors as
 * "error <text>" lines.  Returns the exit status. */
static int worker_main(const char *cuda_lib, const char *ledger_path, const char *uuid,
                       pid_t host, unsigned long step_mib) {
  char why[512] = "", line[sizeof why + 16], id[37];
  CUcontext ctx = NULL;
  CUdevice dev = 0;
  CUdeviceptr ptrs[64];
  int n_ptrs = 0, n = 0, status = 1, rc;
  bh_ledger *l = NULL;
  bh_ledger_device d;
  memset(&d, 0, sizeof d);
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != host || strlen(uuid) != 40) return 1;
  if (cu_load(cuda_lib, why, sizeof why) < 0) goto out;
  if ((rc = cu.Init(0)) != 0 || (rc = cu.DeviceGetCount(&n)) != 0) {
    snprintf(why, sizeof why, "cuInit: %s", cu_str(rc));
    goto out;
  }
  rc = -1;
  for (int i = 0; i < n && rc != 0; i++)
    if (cu_uuid(i, &dev, id) == 0 && strcmp(id, uuid + 4) == 0) rc = 0;
  if (rc != 0) {
    snprintf(why, sizeof why, "no CUDA device with UUID %s", uuid);
    goto out;
  }
  if ((rc = cu.CtxCreate(&ctx, 0, dev)) != 0) {
    snprintf(why, sizeof why, "cuCtxCreate: %s", cu_str(rc));
    goto out;
  }
  if ((rc = bh_ledger_open(&l, ledger_path)) < 0 ||
      (rc = bh_ledger_join(l, BH_ROLE_WORKER, "gpu-check", "c", 1, host)) < 0) {
    snprintf(why, sizeof why, "ledger: %s", bh_strerror(rc));
    goto out;
  }
  snprintf(d.device, sizeof d.device, "cuda:%.40s", uuid);
  if (write_all(1, "ready\n", 6) < 0) goto out;
  for (;;) {
    char c;
    ssize_t got = read(0, &c, 1);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0 || c == 'q') break; /* EOF: the parent is gone or gave up */
    if (n_ptrs == (int)(sizeof ptrs / sizeof ptrs[0])) {
      snprintf(why, sizeof why, "too many steps");
      goto out;
    }
    if ((rc = cu.MemAlloc(&ptrs[n_ptrs], (size_t)step_mib << 20)) != 0) {
      snprintf(why, sizeof why, "cuMemAlloc(%lu MiB): %s", step_mib, cu_str(rc));
      goto out;
    }
    n_ptrs++;
    d.held_bytes += (uint64_t)step_mib << 20;
    if ((rc = bh_ledger_set_device(l, &d)) < 0) {
      snprintf(why, sizeof why, "bh_ledger_set_device: %s", bh_strerror(rc));
      goto out;
    }
    snprintf(line, sizeof line, "held %" PRIu64 "\n", d.held_bytes);
    if (write_all(1, line, strlen(line)) < 0) goto out;
  }
  status = 0;
out:
  if (why[0]) {
    snprintf(line, sizeof line, "error %s\n", why);
    if (write_all(1, line, strlen(line)) < 0) fprintf(stderr, "gpu-check worker: %s\n", why);
  }
  while (n_ptrs > 0) cu.MemFree(ptrs[--n_ptrs]);
  if (ctx) cu.CtxDestroy(ctx);
  bh_ledger_close(l);
  if (status == 0) write_all(1, "bye\n", 4);
  if (cu.lib) dlclose(cu.lib);
  return status;
}

/* --------------------------------------------------------------- parent */

typedef struct {
  pid_t pid;
  int cmd, rep; /* its stdin (we write), its stdout (we read) */
} worker;

static struct {
  unsigned long workers, steps, step_mib, timeout_s;
  const char *cuda_lib, *nvml_lib;
} opt = {2, 3, 256, 240, NULL, NULL};

static int64_t g_deadline;
static int g_failed;

static void fail_check(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void fail_check(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fputs("gpu-check: FAILED: ", stdout);
  vprintf(fmt, ap);
  putchar('\n');
  va_end(ap);
  g_failed = 1;
}

/* Starts one worker.  0 or -errno; w->pid > 0 only on success. */
static int spawn_worker(worker *w, const char *ledger, const char *uuid) {
  int in[2] = {-1, -1}, out[2] = {-1, -1}, rc;
  char host[24], step[24];
  posix_spawn_file_actions_t fa;
  posix_spawnattr_t at;
  sigset_t dflt;
  if (pipe2(in, O_CLOEXEC) < 0 || pipe2(out, O_CLOEXEC) < 0) {
    rc = -errno;
    goto done;
  }
  snprintf(host, sizeof host, "%d", (int)getpid());
  snprintf(step, sizeof step, "%lu", opt.step_mib);
  const char *argv[] = {"bulkhead-gpu-check", "--worker", "--ledger", ledger, "--uuid", uuid,
                        "--host-pid", host, "--step-mib", step,
                        opt.cuda_lib ? "--cuda-library" : NULL, opt.cuda_lib, NULL};
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, in[0], 0); /* dup2 clears O_CLOEXEC */
  posix_spawn_file_actions_adddup2(&fa, out[1], 1);
  posix_spawnattr_init(&at);
  sigemptyset(&dflt);
  sigaddset(&dflt, SIGPIPE);
  posix_spawnattr_setsigdefault(&at, &dflt);
  posix_spawnattr_setflags(&at, POSIX_SPAWN_SETSIGDEF);
  rc = -posix_spawn(&w->pid, "/proc/self/exe", &fa, &at, (char *const *)argv, environ);
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&at);
  if (rc == 0) {
    w->cmd = in[1];
    w->rep = out[0];
    in[1] = out[0] = -1;
  } else {
    w->pid = 0;
  }
done: /* the child's ends always; ours too unless they were kept */
  for (int i = 0; i < 2; i++) {
    if (in[i] >= 0) close(in[i]);
    if (out[i] >= 0) close(out[i]);
  }
  return rc;
}

/* Sends one command byte and reads the reply line into buf.  0 or -1
 * (reported). */
static int ask(worker *w, int i, char c, char *buf, size_t n) {
  int rc = c ? (write_all(w->cmd, &c, 1) < 0 ? -errno : 0) : 0;
  if (rc == 0) rc = read_line(w->rep, buf, n, g_deadline);
  if (rc == 0 && strncmp(buf, "error ", 6) == 0) {
    fail_check("worker %d: %s", i, buf + 6);
    return -1;
  }
  if (rc == -ETIMEDOUT)
    fail_check("timeout: no answer from worker %d within --timeout %lu s", i, opt.timeout_s);
  else if (rc == -EINTR)
    fail_check("interrupted by signal %d", (int)g_stop);
  else if (rc < 0)
    fail_check("worker %d: %s", i, rc == -EPIPE ? "exited without a reply" : strerror(-rc));
  return rc < 0 ? -1 : 0;
}

/* Stops every started worker: 'q' and EOF, then up to 5 s (never past the
 * deadline, none after SIGINT/SIGTERM) for each to exit, then SIGKILL.
 * Always reaps. */
static void stop_workers(worker *w, int n) {
  for (int i = 0; i < n; i++)
    if (w[i].cmd >= 0) {
      if (!g_stop && now_ms() < g_deadline) write_all(w[i].cmd, "q", 1);
      close(w[i].cmd);
      w[i].cmd = -1;
    }
  int64_t until = g_stop ? 0 : now_ms() + 5000; /* a signal to stop: at once */
  if (until > g_deadline) until = g_deadline;
  for (int i = 0; i < n; i++) {
    int st;
    if (w[i].pid <= 0) continue;
    while (waitpid(w[i].pid, &st, WNOHANG) == 0 && now_ms() < until) usleep(10000);
    if (waitpid(w[i].pid, &st, WNOHANG) == 0) {
      kill(w[i].pid, SIGKILL);
      waitpid(w[i].pid, &st, 0);
    }
    w[i].pid = 0;
    if (w[i].rep >= 0) close(w[i].rep);
    w[i].rep = -1;
  }
}

/* Bytes held by this run's workers on `dev_name`, summed from the ledger. */
static int ledger_held(bh_ledger *l, bh_ledger_record *recs, const char *dev_name,
                       uint64_t *sum) {
  int n = bh_ledger_snapshot(l, recs, BH_LEDGER_SLOTS);
  *sum = 0;
  for (int i = 0; i < n; i++) {
    if (recs[i].role != BH_ROLE_WORKER || recs[i].host_pid != getpid()) continue;
    for (uint32_t k = 0; k < recs[i].n_devices; k++)
      if (strcmp(recs[i].devices[k].device, dev_name) == 0) *sum += recs[i].devices[k].held_bytes;
  }
  return n < 0 ? n : 0;
}

static int nvml_free(bh_gpu *g, int idx, uint64_t *free_bytes) {
  bh_gpu_memory m;
  int rc = bh_gpu_memory_read(g, idx, &m);
  if (rc < 0) fail_check("NVML memory read: %s", bh_strerror(rc));
  *free_bytes = m.free_bytes;
  return rc;
}

static int usage(FILE *f, int status) {
  fprintf(f,
          "usage: bulkhead-gpu-check [--workers N] [--steps N] [--step-mib MIB] [--timeout SEC]\n"
          "                          [--cuda-library PATH] [--nvml-library PATH]\n"
          "Checks bulkhead's GPU memory accounting on this machine's CUDA device 0:\n"
          "N worker processes allocate --steps chunks of --step-mib MiB with cuMemAlloc;\n"
          "(a) NVML sees each allocation device-wide by UUID, (b) the ledger's held\n"
          "bytes match exactly, (c) the change-of-variables target agrees with NVML.\n"
          "Defaults: --workers 2 --steps 3 --step-mib 256 --timeout 240.\n"
          "Exit: 0 passed or no NVIDIA GPU, 1 a check or the run failed, 2 usage.\n");
  return status;
}

static int run_checks(void) {
  char why[512], hex[37], uuid[BH_GPU_UUID_MAX], name[BH_GPU_NAME_MAX], dev_name[BH_LEDGER_DEVICE_MAX],
      tmpl[PATH_MAX], ledger_path[PATH_MAX + 8], buf[256];
  const char *tmp = getenv("TMPDIR");
  int n_dev = 0, idx = -1, status = 1, rc, n_started = 0, have_dir = 0;
  CUdevice dev;
  CUcontext ctx = NULL;
  bh_gpu *g = NULL;
  bh_ledger *l = NULL;
  bh_ledger_record *recs = NULL;
  worker w[16];
  uint64_t base, prev, cur, ctx_bytes = 0, held, alloc = 0, step = (uint64_t)opt.step_mib << 20;
  bh_gpu_memory m;

  for (int i = 0; i < 16; i++) w[i] = (worker){0, -1, -1};
  ledger_path[0] = 0;
  if (cu_load(opt.cuda_lib, why, sizeof why) < 0) {
    printf("gpu-check: no NVIDIA driver (%s): nothing to check\n", why);
    return 0;
  }
  if ((rc = cu.Init(0)) != 0 || (rc = cu.DeviceGetCount(&n_dev)) != 0 || n_dev == 0) {
    if (rc == 0 || rc == CU_NO_DEVICE || rc == CU_STUB_LIBRARY || rc == CU_INSUFFICIENT_DRIVER ||
        rc == CU_SYSTEM_DRIVER_MISMATCH) {
      printf("gpu-check: no CUDA device (%s): nothing to check\n",
             rc ? cu_str(rc) : "cuDeviceGetCount is 0");
      status = 0;
    } else {
      fail_check("cuInit: %s (CUresult %d)", cu_str(rc), rc);
    }
    goto out;
  }
  if ((rc = bh_gpu_open_nvml(&g, opt.nvml_lib, why, sizeof why)) < 0) {
    if (rc == -BH_ENODRIVER) printf("gpu-check: no NVIDIA driver (NVML: %s): nothing to check\n", why);
    else fail_check("NVML: %s", why);
    status = rc == -BH_ENODRIVER ? 0 : 1;
    goto out;
  }
  if ((rc = cu_uuid(0, &dev, hex)) != 0) {
    fail_check("cuDeviceGetUuid(0): %s", cu_str(rc));
    goto out;
  }
  for (int mig = 0; mig < 2 && idx < 0; mig++) {
    snprintf(uuid, sizeof uuid, "%s-%s", mig ? "MIG" : "GPU", hex);
    idx = bh_gpu_find(g, uuid);
  }
  if (idx < 0) {
    fail_check("NVML has no device with CUDA device 0's UUID GPU-%s (%s)", hex, bh_strerror(idx));
    goto out;
  }
  if (bh_gpu_name(g, idx, name, sizeof name) < 0) snprintf(name, sizeof name, "?");
  if ((rc = bh_gpu_memory_read(g, idx, &m)) < 0) {
    fail_check("NVML memory read: %s", bh_strerror(rc));
    goto out;
  }
  printf("gpu-check: CUDA device 0 = NVML device %d: %s %s (CUDA_VISIBLE_DEVICES=%s)\n"
         "gpu-check: total %.1f MiB, free %.1f MiB; %lu workers x %lu steps x %lu MiB\n",
         idx, name, uuid, getenv("CUDA_VISIBLE_DEVICES") ? getenv("CUDA_VISIBLE_DEVICES") : "(unset)",
         m.total_bytes / MIB, m.free_bytes / MIB, opt.workers, opt.steps, opt.step_mib);
  if (step * opt.steps * opt.workers + (1ull << 30) * (opt.workers + 1) > m.free_bytes) {
    fail_check("not enough free device memory for this run (lower --steps or --step-mib)");
    goto out;
  }
  if ((rc = cu.CtxCreate(&ctx, 0, dev)) != 0) {
    fail_check("cuCtxCreate: %s", cu_str(rc));
    goto out;
  }
  snprintf(tmpl, sizeof tmpl, "%s/bulkhead-gpu-check-XXXXXX", tmp && *tmp ? tmp : "/tmp");
  if (!mkdtemp(tmpl)) {
    fail_check("mkdtemp(%s): %s", tmpl, strerror(errno));
    goto out;
  }
  have_dir = 1;
  snprintf(ledger_path, sizeof ledger_path, "%s/ledger", tmpl);
  snprintf(dev_name, sizeof dev_name, "cuda:%.40s", uuid);
  if ((rc = bh_ledger_open(&l, ledger_path)) < 0 ||
      (rc = bh_ledger_join(l, BH_ROLE_HOST, "gpu-check", "c", 1, 0)) < 0 ||
      !(recs = calloc(BH_LEDGER_SLOTS, sizeof *recs))) {
    fail_check("ledger %s: %s", ledger_path, rc < 0 ? bh_strerror(rc) : "out of memory");
    goto out;
  }
  if (nvml_free(g, idx, &base) < 0) goto out;
  prev = base;
  printf("gpu-check: NVML free with the parent's context: %.1f MiB\n", base / MIB);
  for (int i = 0; i < (int)opt.workers; i++) {
    if ((rc = spawn_worker(&w[i], ledger_path, uuid)) < 0) {
      fail_check("posix_spawn: %s", strerror(-rc));
      goto out;
    }
    n_started = i + 1;
    if (ask(&w[i], i, 0, buf, sizeof buf) < 0 || nvml_free(g, idx, &cur) < 0) goto out;
    int64_t drop = (int64_t)(prev - cur);
    printf("context  worker %d (pid %d): NVML drop %.1f MiB\n", i, (int)w[i].pid, drop / MIB);
    if (drop > 0 && (uint64_t)drop > ctx_bytes) ctx_bytes = (uint64_t)drop;
    prev = cur;
  }
  uint64_t tol = ctx_bytes + SLACK_BYTES, after_ctx = prev;
  printf("context size %.1f MiB; tolerance (a) %.1f MiB a step, (c) %.1f MiB\n\n"
         "step worker  allocated MiB  NVML drop MiB  (a) off    ledger MiB  (b)  "
         "blind free MiB  true free MiB  (c) target-need\n",
         ctx_bytes / MIB, tol / MIB, ctx_bytes / MIB);
  for (unsigned long s = 1; s <= opt.steps; s++)
    for (int i = 0; i < (int)opt.workers; i++) {
      size_t blind = 0, total = 0;
      if (ask(&w[i], i, 'a', buf, sizeof buf) < 0 || nvml_free(g, idx, &cur) < 0) goto out;
      alloc += step;
      int64_t drop = (int64_t)(prev - cur), off = drop - (int64_t)step;
      int ok_a = llabs(off) <= (long long)tol;
      if ((rc = ledger_held(l, recs, dev_name, &held)) < 0) {
        fail_check("bh_ledger_snapshot: %s", bh_strerror(rc));
        goto out;
      }
      int ok_b = held == alloc;
      if ((rc = cu.MemGetInfo(&blind, &total)) != 0) {
        fail_check("cuMemGetInfo: %s", cu_str(rc));
        goto out;
      }
      int64_t need = (int64_t)step;
      int64_t diff = bh_policy_ask_target(need, (int64_t)blind, 0, (int64_t)cur, 1) - need;
      int ok_c = llabs(diff) <= (long long)ctx_bytes;
      printf("%4lu %6d %14.1f %14.1f %+9.1f %-3s %11.1f %-4s %15.1f %14.1f %+12.1f %s\n", s, i,
             alloc / MIB, drop / MIB, off / MIB, ok_a ? "ok" : "BAD", held / MIB,
             ok_b ? "ok" : "BAD", blind / MIB, cur / MIB, diff / MIB, ok_c ? "ok" : "BAD");
      if (!ok_a) fail_check("(a) step %lu worker %d: NVML drop off by %+.1f MiB", s, i, off / MIB);
      if (!ok_b) fail_check("(b) ledger holds %" PRIu64 " bytes, allocated %" PRIu64, held, alloc);
      if (!ok_c) fail_check("(c) ask target - need = %+.1f MiB", diff / MIB);
      prev = cur;
    }
  int64_t total_off = (int64_t)(after_ctx - prev) - (int64_t)alloc;
  uint64_t total_tol = ctx_bytes + SLACK_BYTES * opt.steps * opt.workers;
  printf("\ntotal: allocated %.1f MiB, NVML drop %.1f MiB, off %+.1f MiB (tolerance %.1f)\n",
         alloc / MIB, ((double)after_ctx - (double)prev) / MIB, total_off / MIB, total_tol / MIB);
  if ((uint64_t)llabs(total_off) > total_tol)
    fail_check("(a) total NVML drop off by %+.1f MiB", total_off / MIB);
  for (int i = 0; i < (int)opt.workers; i++)
    if (ask(&w[i], i, 'q', buf, sizeof buf) < 0) goto out;
  stop_workers(w, n_started);
  if (nvml_free(g, idx, &cur) == 0)
    printf("after the workers exit: NVML free %.1f MiB (%+.1f MiB vs before they started)\n",
           cur / MIB, ((double)cur - (double)base) / MIB);
  status = g_failed;
out:
  stop_workers(w, n_started);
  free(recs);
  bh_ledger_close(l);
  if (ledger_path[0]) unlink(ledger_path);
  if (have_dir) rmdir(tmpl);
  if (ctx) cu.CtxDestroy(ctx);
  bh_gpu_close(g);
  if (cu.lib) dlclose(cu.lib);
  if (status == 0 && g_failed) status = 1;
  if (status == 0 && n_started) printf("gpu-check: all checks passed\n");
  return status;
}

int main(int argc, char **argv) {
  enum { O_WORKER = 256, O_LEDGER, O_UUID, O_HOST, O_STEPMIB, O_STEPS, O_WORKERS, O_TIMEOUT,
         O_CUDA, O_NVML };
  static const struct option longs[] = {
      {"help", no_argument, NULL, 'h'},         {"workers", required_argument, NULL, O_WORKERS},
      {"steps", required_argument, NULL, O_STEPS}, {"step-mib", required_argument, NULL, O_STEPMIB},
      {"timeout", required_argument, NULL, O_TIMEOUT},
      {"cuda-library", required_argument, NULL, O_CUDA},
      {"nvml-library", required_argument, NULL, O_NVML},
      {"worker", no_argument, NULL, O_WORKER},   {"ledger", required_argument, NULL, O_LEDGER},
      {"uuid", required_argument, NULL, O_UUID}, {"host-pid", required_argument, NULL, O_HOST},
      {NULL, 0, NULL, 0}};
  const char *ledger = NULL, *uuid = NULL;
  unsigned long host = 0;
  int is_worker = 0, c;
  opterr = 0;
  while ((c = getopt_long(argc, argv, ":h", longs, NULL)) != -1) {
    unsigned long *num = c == O_WORKERS ? &opt.workers : c == O_STEPS ? &opt.steps
                       : c == O_STEPMIB ? &opt.step_mib : c == O_TIMEOUT ? &opt.timeout_s
                       : c == O_HOST ? &host : NULL;
    unsigned long hi = c == O_WORKERS ? 16 : c == O_STEPS ? 64 : c == O_STEPMIB ? 1ul << 20
                     : c == O_TIMEOUT ? 86400 : (unsigned long)INT_MAX;
    if (c == 'h') return usage(stdout, 0);
    if (c == '?' || c == ':') { /* argv[optind - 1] is the option itself */
      fprintf(stderr, "gpu-check: %s option '%s'\n",
              c == '?' ? "unknown" : "missing the value of", argv[optind - 1]);
      return usage(stderr, 2);
    }
    if (num && parse_uint(optarg, 1, hi, num) < 0) {
      const struct option *lo = longs;
      while (lo->val != c) lo++;
      fprintf(stderr, "gpu-check: option '--%s' wants a whole number in [1, %lu], got '%s'\n",
              lo->name, hi, optarg);
      return usage(stderr, 2);
    }
    if (c == O_WORKER) is_worker = 1;
    if (c == O_LEDGER) ledger = optarg;
    if (c == O_UUID) uuid = optarg;
    if (c == O_CUDA) opt.cuda_lib = optarg;
    if (c == O_NVML) opt.nvml_lib = optarg;
  }
  if (optind < argc) {
    fprintf(stderr, "gpu-check: unexpected argument '%s'\n", argv[optind]);
    return usage(stderr, 2);
  }
  setvbuf(stdout, NULL, _IOLBF, 0);
  if (is_worker) {
    if (!ledger || !uuid || !host) return usage(stderr, 2);
    return worker_main(opt.cuda_lib, ledger, uuid, (pid_t)host, opt.step_mib);
  }
  struct sigaction sa = {.sa_handler = on_signal};
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGTERM, &sa, NULL);
  signal(SIGPIPE, SIG_IGN);
  g_deadline = now_ms() + (int64_t)opt.timeout_s * 1000;
  return run_checks();
}
