/*
 * ledger.h -- the machine-wide ledger: one shared-memory segment per user
 * that every bulkhead process maps (a ComfyUI host, its workers, other
 * ComfyUI instances, the `bulkhead` command).
 *
 * Each process that joins gets one fixed-size record and is the only one
 * that writes it: who it is (pid + process start time, role, pack,
 * interpreter, generation), what it is doing (run state, last-used time),
 * what it holds per device (held, pinned, pin ceiling, pager, floor,
 * reserve bytes) and per model (size, resident bytes), and a count of the
 * memory it released.  Everyone reads every record without IPC and without
 * waiting on a writer for long (a seqlock per record); a process that
 * crashes leaves a record the next reader notices and reaps (its pid is
 * gone, a zombie, or reused by a process with another start time).
 *
 * A typical worker:
 *
 *   bh_ledger *l;
 *   int rc = bh_ledger_open(&l, NULL);            // $BULKHEAD_LEDGER or
 *   if (rc < 0) return rc;                        // /dev/shm/bulkhead-<uid>/ledger
 *   rc = bh_ledger_join(l, BH_ROLE_WORKER, "my-pack", "3.12.1", 1, host_pid);
 *   bh_ledger_device d = {.device = "cuda:GPU-8f3a...", .held_bytes = 1 << 30};
 *   bh_ledger_set_device(l, &d);
 *   bh_ledger_model m = {.id = 7, .name = "unet", .device = "cuda:GPU-8f3a...",
 *                        .size_bytes = 5u << 30, .resident_bytes = 5u << 30};
 *   bh_ledger_set_model(l, &m);
 *   ...
 *   bh_ledger_close(l);                           // leaves; the last one out
 *                                                 // unlinks the segment
 *
 * and a host reading one model's residency on every loaded_size() call:
 *
 *   int hint = -1;
 *   uint64_t size, resident;
 *   rc = bh_ledger_model_read(l, worker_pid, 7, &hint, &size, &resident);
 *
 * Conventions are those of bulkhead.h: >= 0 on success, a negative errno or
 * -BH_E* code on failure.  A bh_ledger handle may be used from several
 * threads at once (not during or after its bh_ledger_close).  After fork() the child's copy of a handle does not own
 * the parent's record (writers fail with -BH_ENOTJOINED); the child may join
 * on its own, and closing the copy neither leaves nor unlinks anything.
 */
#ifndef BULKHEAD_LEDGER_H
#define BULKHEAD_LEDGER_H

#include "bulkhead/bulkhead.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Layout version of the segment.  Every bulkhead process on the machine
 * must agree; a segment of another version fails to open with
 * -BH_ELEDGERVER. */
#define BH_LEDGER_VERSION 2
/* Records in one segment: every bulkhead process of one user on the
 * machine (each host, each of its workers, a tool while it reads), e.g.
 * 8 ComfyUI instances of 60 isolated packs each.  The 513th process runs
 * without a record (a warning; what it holds is invisible to the others). */
#define BH_LEDGER_SLOTS 512
/* Device entries per record: cpu and 16 GPUs (the most one node carries).
 * A record that would need more refuses the next device with -BH_EMODELS;
 * the census goes on without it. */
#define BH_LEDGER_DEVICES 17
#define BH_LEDGER_MODELS 32      /* model entries per record */
#define BH_LEDGER_PACK_MAX 64    /* sizes of the string fields, NUL included */
#define BH_LEDGER_INTERP_MAX 48
#define BH_LEDGER_DEVICE_MAX 48
#define BH_LEDGER_NAME_MAX 48

typedef struct bh_ledger bh_ledger;

enum bh_ledger_role { BH_ROLE_HOST = 1, BH_ROLE_WORKER = 2, BH_ROLE_TOOL = 3 };
/* BH_RUN_STALE is never written: a snapshot reports it for a record whose
 * owner (alive, e.g. stopped) stayed mid-write, with only slot and pid.
 * BH_RUN_WORKING: a worker in no call whose pack said it is at work of its
 * own (bulkhead.working(): a job a route started); never idle. */
enum bh_ledger_run { BH_RUN_IDLE = 0, BH_RUN_BUSY = 1, BH_RUN_RELEASING = 2, BH_RUN_STALE = 3, BH_RUN_WORKING = 4 };

/* One device's bytes as the record's owner accounts them. */
typedef struct bh_ledger_device {
  char device[BH_LEDGER_DEVICE_MAX]; /* "cpu", "cuda:GPU-8f3a..." (NUL-terminated) */
  uint64_t held_bytes;               /* everything this process holds there */
  uint64_t pinned_bytes;             /* page-locked host memory in use */
  uint64_t pin_ceiling_bytes;        /* most it may pin */
  uint64_t pager_bytes;              /* held by its weight pager / offload cache */
  uint64_t floor_bytes;              /* what it cannot give back while running */
  uint64_t reserve_bytes;            /* what it is about to need */
} bh_ledger_device;

/* One model's residency (the public copy form). */
typedef struct bh_ledger_model {
  uint64_t id;
  char name[BH_LEDGER_NAME_MAX];
  char device[BH_LEDGER_DEVICE_MAX]; /* a device entry's name, or "" */
  uint64_t size_bytes;
  uint64_t resident_bytes;
} bh_ledger_model;

/* A consistent copy of one record. */
typedef struct bh_ledger_record {
  int slot;
  pid_t pid;
  uint64_t start_time; /* /proc/<pid>/stat field 22, clock ticks since boot */
  int role;            /* enum bh_ledger_role */
  uint32_t generation;
  pid_t host_pid;      /* a worker's host, else 0 */
  char pack[BH_LEDGER_PACK_MAX];
  char interpreter[BH_LEDGER_INTERP_MAX];
  int run;             /* enum bh_ledger_run */
  uint64_t last_used_ns; /* CLOCK_MONOTONIC (machine-wide) of the last set_run */
  uint64_t release_count, released_bytes;
  uint32_t n_devices, n_models;
  bh_ledger_device devices[BH_LEDGER_DEVICES];
  bh_ledger_model models[BH_LEDGER_MODELS];
} bh_ledger_record;

/* Writes the default path into buf: $BULKHEAD_LEDGER if set and
 * non-empty, else /dev/shm/bulkhead-<uid>/ledger in a private directory
 * (bh_private_dir), or $XDG_RUNTIME_DIR/bulkhead-ledger when another user
 * took that directory and XDG_RUNTIME_DIR is a private directory of ours.
 * Creates nothing (bh_ledger_open(NULL) makes the directory).  Returns its
 * length, or -ENAMETOOLONG when it does not fit in n bytes. */
BH_EXTERN int bh_ledger_default_path(char *buf, size_t n);

/* Opens (creating and initialising it if needed) the ledger at `path`, or
 * at the default path when path is NULL.  The file is refused when it is
 * not a regular file (-EINVAL), is owned by another uid (-EPERM), or grants
 * any group/other permission (-EACCES); a file that is not a ledger fails
 * with -BH_ELEDGER and one of another layout with -BH_ELEDGERVER.  A
 * symlink at the path is refused (-ELOOP).  On success *out is owned by the
 * caller: bh_ledger_close.  Never blocks for long (a file lock held while
 * another process initialises the segment). */
BH_EXTERN int bh_ledger_open(bh_ledger **out, const char *path);

/* Makes `path` a directory 0700 when create is set and it is missing (its
 * parent must exist), then checks it with lstat: 0 when it is a directory
 * owned by our euid with no group or other permission; else -ENOENT
 * (missing), -ELOOP (a symbolic link), -ENOTDIR, -EPERM (another owner) or
 * -EACCES (group/other bits).  Used for every directory bulkhead keeps
 * private state in (the ledger's, the control sockets', a worker's package
 * root). */
BH_EXTERN int bh_private_dir(const char *path, int create);

/* Leaves (when this process joined through this handle), unmaps and frees
 * the handle.  When no other handle anywhere has the segment open and no
 * live record is left, the file is unlinked.  In a forked child it only
 * unmaps and frees.  NULL is ignored. */
BH_EXTERN void bh_ledger_close(bh_ledger *l);

/* The path the handle opened (owned by the handle). */
BH_EXTERN const char *bh_ledger_path(const bh_ledger *l);

/* Claims a record for this process (reaping dead ones first when the
 * ledger is full) and fills it.  A process that already has a record
 * (same pid and start time, e.g. a second join) gets that record back,
 * refilled, never a duplicate.  Strings are copied; one too long for its
 * field fails with -ENAMETOOLONG; NULL means "".  Returns the slot index,
 * -EINVAL for a bad role, -BH_ELEDGERFULL when every slot is live,
 * -ETIMEDOUT when another process held the segment's lock for seconds
 * (one stopped while holding it: the wait is bounded). */
BH_EXTERN int bh_ledger_join(bh_ledger *l, int role, const char *pack, const char *interpreter,
                             uint32_t generation, pid_t host_pid);

/* Frees this process's record.  Returns 0, -BH_ENOTJOINED, or -ETIMEDOUT
 * as for join (the record then stays until this process exits and a
 * reader reaps it). */
BH_EXTERN int bh_ledger_leave(bh_ledger *l);

/* The slot this process's record is in, or -BH_ENOTJOINED. */
BH_EXTERN int bh_ledger_slot(const bh_ledger *l);

/* Writers of this process's own record.  Each returns 0, -BH_ENOTJOINED
 * (no join, a forked child, or the record was taken from us), -EINVAL for
 * a bad argument, -ENAMETOOLONG for an unterminated string field. */

/* Sets the run state and stamps last_used_ns. */
BH_EXTERN int bh_ledger_set_run(bh_ledger *l, int run);
/* Inserts or replaces (by device name, non-empty) one device entry.
 * -BH_EMODELS when all BH_LEDGER_DEVICES entries are taken. */
BH_EXTERN int bh_ledger_set_device(bh_ledger *l, const bh_ledger_device *d);
/* Inserts or replaces (by id) one model entry.  A device named by the
 * model that has no entry yet gets one with zero bytes.  -BH_EMODELS when
 * all BH_LEDGER_MODELS (or device) entries are taken. */
BH_EXTERN int bh_ledger_set_model(bh_ledger *l, const bh_ledger_model *m);
/* Removes a model entry.  -ENOENT when there is none with that id. */
BH_EXTERN int bh_ledger_drop_model(bh_ledger *l, uint64_t id);
/* Counts one release of `bytes` (release_count += 1, released_bytes += bytes). */
BH_EXTERN int bh_ledger_note_release(bh_ledger *l, uint64_t bytes);

/* Reaps the records of dead processes, then copies at most `max` live
 * records into out (slot order).  Returns the number copied.  A record
 * whose live owner stayed mid-write past the retry budget (a stopped
 * process) does not fail the snapshot: it is copied as slot and pid only,
 * run BH_RUN_STALE, everything else zero.  It never waits on the
 * segment's lock: when another process holds it, it does not reap but
 * still leaves dead owners' records out. */
BH_EXTERN int bh_ledger_snapshot(bh_ledger *l, bh_ledger_record *out, int max);

/* Copies the live record of `pid`.  Returns 0, -ESRCH when there is none
 * (a dead owner's record is reaped on the way, unless another process
 * holds the segment's lock: a read never waits on it), -EAGAIN when its
 * live owner stayed mid-write past the retry budget. */
BH_EXTERN int bh_ledger_read(bh_ledger *l, pid_t pid, bh_ledger_record *out);

/* The fast path behind a stand-in's loaded_size(): one model's size and
 * resident bytes from process pid's record, without locks or system calls
 * (a few hundred ns).  *slot_hint caches where pid's record was found;
 * initialise it to -1 and keep it per pid.  Returns 0, -ESRCH when pid has
 * no live record, -ENOENT when the record has no such model, -EAGAIN when
 * its owner stayed mid-write too long.  It does not check whether pid is
 * still alive; bh_ledger_snapshot / bh_ledger_reap do. */
BH_EXTERN int bh_ledger_model_read(bh_ledger *l, pid_t pid, uint64_t model_id, int *slot_hint,
                                   uint64_t *size_bytes, uint64_t *resident_bytes);

/* Where process pid's record stands: *version is its write counter,
 * which every change to the record moves (it only grows), so a reader
 * that keeps the version it saw before a bh_ledger_read and finds it
 * unchanged later knows the record is what it read.  Like
 * bh_ledger_model_read: no locks, no system calls, *slot_hint cached,
 * and pid's liveness not checked.  Returns 0, or -ESRCH when pid has no
 * live record. */
BH_EXTERN int bh_ledger_version(bh_ledger *l, pid_t pid, int *slot_hint, uint32_t *version);

/* Frees the records of processes that are gone (no such pid, a zombie, or
 * a pid now owned by a process with another start time).  Returns how
 * many were reaped, or -ETIMEDOUT as for join. */
BH_EXTERN int bh_ledger_reap(bh_ledger *l);

#ifdef __cplusplus
}
#endif
#endif /* BULKHEAD_LEDGER_H */
