/*
 * probe.h -- what the machine has free: GPU memory through NVML and RAM
 * through /proc and the cgroup.
 *
 * GPU.  NVML is read in this process: the driver's libnvidia-ml is
 * dlopen'ed (no NVIDIA header or link-time dependency), so a machine
 * without a driver simply reports BH_ENODRIVER and the caller keeps
 * upstream's own semantics.  An opened probe is a `bh_gpu`: a
 * `struct bh_gpu_backend` (a table of function pointers) plus its context.
 * The real NVML is one backend (bh_gpu_open_nvml); a test double is
 * another (bh_gpu_open_backend).  Devices are numbered by the backend's
 * index (NVML's enumeration, which is PCI bus order), but a caller should
 * resolve a device by its UUID (bh_gpu_find) or through the rules CUDA
 * applies to CUDA_VISIBLE_DEVICES (bh_gpu_visible), never by assuming
 * CUDA ordinal == NVML index.  All bh_gpu calls are thread-safe; closing
 * while another thread still uses the probe is the caller's bug.
 *
 * RAM.  bh_ram_read reads /proc/meminfo, /proc/swaps, /proc/self/cgroup,
 * /proc/self/mountinfo and the memory controller's files (cgroup v2, or v1
 * where the memory controller is mounted that way) below a root directory,
 * so tests can point it at a fixture tree.  Available RAM is MemAvailable
 * clamped by what the tightest cgroup level (this process's cgroup or any
 * ancestor) still allows.
 *
 * MemAvailable leaves out the free pages parked on per-CPU lists, which
 * /proc/zoneinfo shows; they are added back before the clamp.
 *
 * Readings carry a `valid` flag; a failed read leaves valid == 0 and
 * returns a negative code.  No magic values.
 */
#ifndef BULKHEAD_PROBE_H
#define BULKHEAD_PROBE_H

#include "bulkhead/bulkhead.h"

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------- GPU */

/* Room for any UUID or name a backend reports, NUL included (NVML's own
 * limits are 96 bytes for both). */
#define BH_GPU_UUID_MAX 96
#define BH_GPU_NAME_MAX 96

/* One device's memory.  With NVML's v2 memory call `reserved_bytes` is the
 * driver's own reservation and `used_bytes` excludes it; with the v1 call
 * reserved_bytes is 0 and used_bytes includes it.  free_bytes is the same
 * either way. */
typedef struct bh_gpu_memory {
  int valid;
  uint64_t total_bytes;
  uint64_t free_bytes;
  uint64_t used_bytes;
  uint64_t reserved_bytes;
} bh_gpu_memory;

/* A GPU backend: the real NVML and the tests' doubles are instances of
 * this struct.  Every function gets the context given to
 * bh_gpu_open_backend and returns >= 0 or a negative code like the public
 * functions.  Indices passed in are already checked against [0, count)
 * except where said.  process_used and lookup_uuid may be NULL. */
struct bh_gpu_backend {
  const char *name; /* "nvml", "table", ...: static */
  /* Number of devices (fixed for the life of the context). */
  int (*count)(void *ctx);
  /* The device's UUID ("GPU-...") into buf, NUL-terminated. */
  int (*uuid)(void *ctx, int index, char *buf, size_t len);
  /* The device's marketing name into buf, NUL-terminated. */
  int (*device_name)(void *ctx, int index, char *buf, size_t len);
  /* A memory reading.  index may also be one lookup_uuid returned. */
  int (*memory)(void *ctx, int index, bh_gpu_memory *out);
  /* Bytes the process `pid` holds on the device (0 when it holds none),
   * -ENOTSUP when the backend cannot tell, -ENODATA when the driver hides
   * the figure. */
  int (*process_used)(void *ctx, int index, pid_t pid, uint64_t *bytes);
  /* A device by full UUID that is not among [0, count) (a MIG instance):
   * returns an index >= count that memory/uuid/device_name accept, or
   * -BH_ENODEVICE. */
  int (*lookup_uuid)(void *ctx, const char *uuid);
  /* Frees the context (and shuts the driver down). */
  void (*close)(void *ctx);
};

typedef struct bh_gpu bh_gpu;

/* Opens NVML.  library_path NULL searches "libnvidia-ml.so.1" then
 * "libnvidia-ml.so" the way dlopen does (LD_LIBRARY_PATH, ld.so.cache);
 * a path loads exactly that file.  Every required symbol must resolve
 * (_v2 names preferred) and nvmlInit must succeed, else nothing stays
 * loaded.  Failures: -BH_ENODRIVER (no library, a required symbol
 * missing, or nvmlInit failed: no kernel driver), -BH_ENVML (a call
 * after init failed), -ENOMEM.  On failure `err` (if not NULL) holds the
 * reason, dlerror()'s text included.  *out is owned by the caller:
 * bh_gpu_close.  Example:
 *
 *   bh_gpu *g; char why[256];
 *   if (bh_gpu_open_nvml(&g, NULL, why, sizeof why) == -BH_ENODRIVER)
 *     ... no driver: keep upstream semantics ...
 *   int dev = bh_gpu_find(g, "GPU-5d0f");        // UUID or unique prefix
 *   bh_gpu_memory m;
 *   if (dev >= 0 && bh_gpu_memory_read(g, dev, &m) == 0) use(m.free_bytes);
 *   bh_gpu_close(g);
 */
BH_EXTERN int bh_gpu_open_nvml(bh_gpu **out, const char *library_path, char *err, size_t errlen);

/* Opens a probe over any backend.  `be` must stay valid while the probe
 * is open (normally static); `ctx` is consumed: be->close(ctx) runs on
 * bh_gpu_close, or at once if this fails -- except for -EINVAL (out or be
 * NULL, or a required function missing), when nothing of be is called.
 * The device UUIDs are read (and cached) here.  *out is owned by the
 * caller: bh_gpu_close. */
BH_EXTERN int bh_gpu_open_backend(bh_gpu **out, const struct bh_gpu_backend *be, void *ctx,
                                  char *err, size_t errlen);

/* Closes the backend (nvmlShutdown, dlclose) and frees g.  NULL is fine. */
BH_EXTERN void bh_gpu_close(bh_gpu *g);

/* The backend's name ("nvml").  Static string. */
BH_EXTERN const char *bh_gpu_backend_name(const bh_gpu *g);

/* Number of devices, >= 0, or -EINVAL. */
BH_EXTERN int bh_gpu_count(const bh_gpu *g);

/* Copies device `index`'s UUID into uuid (NUL-terminated).  Returns its
 * length, -BH_ENODEVICE for an index out of range, -ERANGE when len is too
 * small. */
BH_EXTERN int bh_gpu_uuid(bh_gpu *g, int index, char *uuid, size_t len);

/* Like bh_gpu_uuid for the device's name ("NVIDIA H200"). */
BH_EXTERN int bh_gpu_name(bh_gpu *g, int index, char *name, size_t len);

/* Resolves a UUID, or a prefix of one, to a device index.  Matching is
 * case-insensitive; a prefix must match exactly one device ("GPU-" alone
 * matches every device).  A full MIG UUID ("MIG-...") the device list does
 * not hold is looked up through the backend and gets an index >= count.
 * Returns the index, -BH_ENODEVICE (no match), -ENOTUNIQ (prefix of more
 * than one device), -EINVAL. */
BH_EXTERN int bh_gpu_find(bh_gpu *g, const char *uuid_or_prefix);

/* Maps CUDA device ordinal `cuda_ordinal` to a device index the way CUDA
 * reads CUDA_VISIBLE_DEVICES (pass the variable's value, or NULL when it
 * is unset):
 *   - unset: every device, ordinal i is index i;
 *   - "": no devices;
 *   - a comma-separated list, entries trimmed of blanks: "GPU-<prefix>" or
 *     "MIG-<uuid>" resolve as bh_gpu_find does; a plain integer is an NVML
 *     index; the first entry that is invalid (unknown, ambiguous, out of
 *     range, a repeat, anything else) ends the list, as in CUDA.
 * Plain integers and the unset case assume CUDA_DEVICE_ORDER=PCI_BUS_ID
 * (NVML enumerates in PCI bus order, CUDA by default "fastest first"):
 * prefer the UUID torch reports (torch.cuda.get_device_properties(i).uuid)
 * with bh_gpu_find.  Returns the index or -BH_ENODEVICE when the ordinal
 * is not visible. */
BH_EXTERN int bh_gpu_visible(bh_gpu *g, const char *cuda_visible_devices, int cuda_ordinal);

/* Reads device `index`'s memory now.  Returns 0 with out->valid = 1, or a
 * negative code with out->valid = 0: -BH_ENODEVICE, -BH_ENVML (the driver
 * failed; e.g. the GPU fell off the bus), -ENOTSUP. */
BH_EXTERN int bh_gpu_memory_read(bh_gpu *g, int index, bh_gpu_memory *out);

/* Bytes of device memory process `pid` holds on device `index` (compute
 * contexts), 0 when it holds none.  -ENOTSUP when the driver lacks the
 * call, -ENODATA when it hides the figure (no permission, some vGPU and
 * container set-ups: NVML reports host pids).  *bytes is set only on
 * success. */
BH_EXTERN int bh_gpu_process_used(bh_gpu *g, int index, pid_t pid, uint64_t *bytes);

/* ------------------------------------------------------------------- RAM */

typedef struct bh_ram_reading {
  int valid;
  /* What this process can use: MemTotal clamped by the smallest limit of
   * any cgroup level, and MemAvailable clamped by what the tightest level
   * still allows (limit - current + reclaimable, never below 0). */
  uint64_t total_bytes;
  uint64_t available_bytes;
  /* /proc/meminfo as read (MemAvailable falls back to MemFree + Buffers +
   * Cached on kernels without it). */
  uint64_t meminfo_total_bytes;
  uint64_t meminfo_available_bytes;
  /* 2 or 1: the hierarchy the memory controller was found in; 0 none. */
  int cgroup_version;
  /* 1 when some level has a finite limit; the three figures below are that
   * tightest level's (all 0 when limited is 0). */
  int limited;
  uint64_t cgroup_limit_bytes;
  uint64_t cgroup_current_bytes;
  uint64_t cgroup_reclaimable_bytes; /* inactive_file (v1: total_inactive_file) */
  /* Sum of the sizes in /proc/swaps (0 without the file). */
  uint64_t swap_total_bytes;
  /* Free pages parked on the kernel's per-CPU lists ("count:" of every
   * pageset in /proc/zoneinfo): free and handed out first, but outside
   * MemAvailable.  Since Linux 6.7 a list grows to hundreds of MiB after an
   * allocation burst, so pages a process just freed can stay there for
   * minutes.  Counted in available_bytes; pcp_valid is 0 (and the figure 0)
   * where zoneinfo could not be read. */
  int pcp_valid;
  uint64_t pcp_free_bytes;
} bh_ram_reading;

/* Reads RAM as seen by this process, every file below `root` (NULL or "/":
 * the real system).  Files read: proc/meminfo (required), proc/swaps,
 * proc/zoneinfo (optional: unreadable, it adds nothing; lines it cannot
 * read are skipped), proc/self/cgroup, proc/self/mountinfo (to find the controller's mount;
 * /sys/fs/cgroup or /sys/fs/cgroup/memory without it), and per level of the
 * cgroup path, leaf to root, v2: memory.max, memory.current, memory.stat;
 * v1: memory.limit_in_bytes, memory.usage_in_bytes, memory.stat.  A level
 * without the limit file imposes nothing; v1 limits of 2^62 or more mean
 * unlimited.  Returns 0 with out->valid = 1, or with out->valid = 0:
 * -BH_ECGROUP (a malformed file: `err`, if not NULL, names it),
 * -ENOENT (no meminfo), -ENAMETOOLONG, -ENOMEM, another -errno from
 * reading.  Never allocates what the caller frees. */
BH_EXTERN int bh_ram_read(const char *root, bh_ram_reading *out, char *err, size_t errlen);

#ifdef __cplusplus
}
#endif
#endif /* BULKHEAD_PROBE_H */
