/*
 * ledger.c -- the machine-wide ledger: one shared-memory file per user,
 * mapped by every bulkhead process, one record per process.
 *
 * Design.  Each process that joins claims one fixed-size record and from
 * then on is the only writer of it; everyone reads every record with no
 * IPC.  Readers never wait on a writer for long: each record is guarded by
 * a seqlock (a counter that is odd while its owner writes), so a reader
 * copies the record and retries when the counter moved.  Only claiming,
 * releasing and reaping a record take the one lock in the segment, a
 * robust process-shared mutex: a process killed while holding it leaves it
 * EOWNERDEAD, and the next locker marks it consistent and goes on (every
 * critical section leaves the slots in a state the reaper understands, see
 * below).  A process that dies leaves a live record behind; whoever
 * notices (a snapshot, a read, a join that finds the ledger full, a close)
 * reaps it: the pid is gone, is a zombie, or now belongs to a process with
 * another start time (/proc/<pid>/stat field 22), i.e. the pid was reused.
 *
 * Layout (BH_LEDGER_VERSION 2, host byte order, 2248704 bytes; version 1
 * had 64 records of 4 devices):
 *
 *   offset 0      header, 4096 bytes
 *     0   char     magic[8]        "BHLEDGR\0", written last at creation
 *     8   u32      version         BH_LEDGER_VERSION
 *     12  u32      head_bytes      4096
 *     16  u32      record_bytes    4384 (sizeof(bh__slot))
 *     20  u32      record_count    BH_LEDGER_SLOTS (512)
 *     24  u32      mutex_bytes     sizeof(pthread_mutex_t): a 32-bit and a
 *     28  u32      reserved        64-bit process must not share a mutex
 *     32  pthread_mutex_t mu       robust, process-shared
 *   offset 4096   record_count records of record_bytes (bh__slot below):
 *     0   u32      seq             seqlock; odd while being written
 *     4   u32      reserved
 *     8   body (bh__body):
 *         u32 state (FREE 0 / LIVE 1), i32 pid, u32 role, u32 generation,
 *         u64 start_time, i32 host_pid, u32 run, u32 n_devices, u32 n_models,
 *         u64 last_used_ns, u64 release_count, u64 released_bytes,
 *         char pack[64], char interpreter[48], u64 reserved,
 *         17 x device {char name[48]; u64 held, pinned, pin_ceiling, pager,
 *                     floor, reserve},                         (96 bytes each)
 *         32 x model {u64 id; u32 device (index into the devices, or
 *                     BH__NO_DEVICE); u32 reserved; char name[48];
 *                     u64 size, resident}                      (80 bytes each)
 *
 * Who writes what:
 *   header         the creator, once, under the INIT file lock (below);
 *                  afterwards only the mutex word changes.
 *   state, pid, start_time
 *                  under the mutex only: claimed by a joiner (FREE ->
 *                  LIVE), released by its owner's leave or by a reaper
 *                  (LIVE -> FREE, the whole body zeroed).
 *   everything else in a LIVE record
 *                  its owner only (the process whose pid and start time it
 *                  holds, and within it one thread at a time: the handle's
 *                  process-local mutex), without the shared mutex.
 *   seq            whoever writes the body, around every change: relaxed
 *                  store of an odd value and a release fence, the fields,
 *                  then a release store of the next even value.  Readers:
 *                  acquire load (retry while odd), copy, acquire fence,
 *                  relaxed reload, retry if it moved; a bounded number of
 *                  tries (pause, then yield, then short sleeps: ~40 ms in
 *                  all), then an owner that is dead is reaped and one that
 *                  is alive is -EAGAIN.
 *                  Single writer per record, so seq needs no RMW.  Field
 *                  copies are plain memcpy / relaxed loads of plain fields:
 *                  in practice a seqlock (the kernel's, glibc's), formally a
 *                  benign race.
 *
 * A slot left mid-write by a process that died under the mutex (seq odd,
 * state FREE, or LIVE with a dead pid) is cleared by the next reap.
 *
 * The mutex, and the file locks below, are waited for at most
 * BH__LOCK_WAIT_MS (an open then fails with -ETIMEDOUT, a close leaves the
 * file for the next closer to unlink; critical sections take
 * microseconds; only a holder that is stopped, not dead, keeps it longer).
 * Then readers go on without reaping (a snapshot leaves out the records
 * of dead owners instead of freeing them; the next reader frees them) and
 * join / leave fail with -ETIMEDOUT (a record left behind that way is
 * reaped once its process exits).
 *
 * Lifetime of the file.  Open with O_CREAT|O_NOFOLLOW|O_CLOEXEC, mode 0600;
 * refuse a file of another uid or with group/other bits.  Two one-byte
 * open-file-description locks (fcntl F_OFD_SETLK; like flock they belong
 * to the open file, are shared with a forked child and vanish with the
 * process) order openers and closers:
 *   byte 0, INIT  exclusive around creation (ftruncate + header),
 *                 validation, and a closer's decision to unlink;
 *   byte 1, OPEN  shared by every open handle for its whole life, taken
 *                 before INIT is let go.
 * An opener that finds a file of the full size with an all-zero magic
 * knows its creator died mid-way (it would still hold INIT otherwise) and
 * initialises it again.  A closer takes INIT, then tries OPEN exclusively
 * without waiting: success means no other handle anywhere has the file
 * open, and if no live record is left either the file is unlinked (still
 * under INIT, and only if the path still names this file).  An opener
 * whose file was unlinked before it got INIT (st_nlink 0) starts over.  A
 * crash leaves the file; the next opener reaps what it finds there.
 * (flock() holds one lock per open file, so an opener's exclusive lock
 * would wait for every open handle to close.)
 *
 * Fuzzing (fuzz/fuzz_ledger.c).  bh__ledger_open_mem opens an image in
 * memory through the same header check (bh__head_valid) as a file, and
 * the readers cannot tell the difference.  A fuzz build
 * (FUZZING_BUILD_MODE_UNSAFE_FOR_PRODUCTION) judges liveness by a rule on
 * the record (BH__FUZZ_START_TIME, internal.h) instead of /proc and keeps
 * the seqlock's retries few; nothing else changes.  Every count and
 * string a reader takes from a record is clamped (bh__to_record), so a
 * damaged segment gives odd numbers, never an over-read.
 *
 * Not covered: processes in another pid namespace sharing /dev/shm (their
 * pids mean nothing here), and a process of the same uid truncating the
 * file under us (mappings would SIGBUS); both are outside what one user's
 * bulkhead processes do.
 */
#include "internal.h"
#include "bulkhead/ledger.h"

#include <fcntl.h>
#include <limits.h>
#include <sched.h>
#include <stdio.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>

#define BH__MAGIC "BHLEDGR"      /* with its NUL: 8 bytes */
#define BH__HEAD_BYTES 4096u
#define BH__NO_DEVICE UINT32_MAX
#ifndef FUZZING_BUILD_MODE_UNSAFE_FOR_PRODUCTION
#define BH__SPINS 1000           /* seqlock tries before giving up */
#define BH__SPINS_BUSY 64        /* of which the first ones only pause, */
#define BH__SPINS_YIELD 200      /* the next ones yield, the rest sleep 50 us */
#else
/* Fuzz builds (fuzz/): no other process writes the image, so a slot that
 * is odd stays odd; a few tries take the same paths as a thousand. */
#define BH__SPINS 4
#define BH__SPINS_BUSY 4
#define BH__SPINS_YIELD 4
#endif
#define BH__OPEN_TRIES 64        /* opens that found the file unlinked (backing off) */
#define BH__LOCK_WAIT_MS 2000    /* most a caller waits for the segment's mutex */
#ifdef BH_TESTING
/* Test builds read the wait from a variable a test may shorten (internal.h),
 * so the tests of a stopped holder see the same bounded wait end in
 * milliseconds instead of waiting out two seconds each. */
int bh__ledger_lock_wait_ms = BH__LOCK_WAIT_MS;
#define BH__WAIT_MS bh__ledger_lock_wait_ms
#else
#define BH__WAIT_MS BH__LOCK_WAIT_MS
#endif

enum { BH__FREE = 0, BH__LIVE = 1 };

typedef struct bh__dev {
  char name[BH_LEDGER_DEVICE_MAX];
  uint64_t held, pinned, pin_ceiling, pager, floor, reserve;
} bh__dev;

typedef struct bh__model {
  uint64_t id;
  uint32_t device;
  uint32_t reserved;
  char name[BH_LEDGER_NAME_MAX];
  uint64_t size, resident;
} bh__model;

typedef struct bh__body {
  uint32_t state;
  int32_t pid;
  uint32_t role;
  uint32_t generation;
  uint64_t start_time;
  int32_t host_pid;
  uint32_t run;
  uint32_t n_devices;
  uint32_t n_models;
  uint64_t last_used_ns;
  uint64_t release_count;
  uint64_t released_bytes;
  char pack[BH_LEDGER_PACK_MAX];
  char interpreter[BH_LEDGER_INTERP_MAX];
  uint64_t reserved;
  bh__dev devices[BH_LEDGER_DEVICES];
  bh__model models[BH_LEDGER_MODELS];
} bh__body;

typedef struct bh__slot {
  _Atomic uint32_t seq;
  uint32_t reserved;
  bh__body body;
} bh__slot;

typedef struct bh__head {
  char magic[8];
  uint32_t version;
  uint32_t head_bytes;
  uint32_t record_bytes;
  uint32_t record_count;
  uint32_t mutex_bytes;
  uint32_t reserved;
  pthread_mutex_t mu;
} bh__head;

/* The layout is the protocol between processes: pin it. */
_Static_assert(sizeof(bh__dev) == 96, "device entry is 96 bytes");
_Static_assert(sizeof(bh__model) == 80, "model entry is 80 bytes");
_Static_assert(offsetof(bh__body, start_time) == 16, "body layout");
_Static_assert(offsetof(bh__body, pack) == 64, "body layout");
_Static_assert(offsetof(bh__body, devices) == 184, "body layout");
_Static_assert(sizeof(bh__slot) == 4384, "record is 4384 bytes");
_Static_assert(offsetof(bh__head, mu) == 32, "header layout");
_Static_assert(sizeof(bh__head) <= BH__HEAD_BYTES, "header fits its page");
_Static_assert(sizeof(_Atomic uint32_t) == 4, "seq is a plain u32 in the file");

#define BH__FILE_BYTES ((size_t)BH__HEAD_BYTES + (size_t)BH_LEDGER_SLOTS * sizeof(bh__slot))

struct bh_ledger {
  int fd;                /* -1: an image in memory (bh__ledger_open_mem) */
  pid_t opener;          /* the process that opened it (close after fork) */
  bh__head *head;        /* the mapping */
  bh__slot *slots;
  pthread_mutex_t wmu;   /* this process's writers, join and leave */
  atomic_int joined_pid; /* the pid that joined through this handle, or 0 */
  atomic_int slot;       /* its record, or -1 */
  uint64_t start_time;   /* joined_pid's start time */
  char path[];
};

/* ------------------------------------------------------------- /proc */

/* Parses /proc/<pid>/stat: the state letter (field 3) and the start time
 * (field 22).  comm (field 2) may hold spaces and parentheses, so fields
 * are counted from after the LAST ')'. */
static int bh__proc_stat(pid_t pid, char *state, uint64_t *start_time) {
  char path[64], buf[4096];
  size_t n = 0;
  int fd = -1, rc = 0;
  if (pid <= 0) return -ESRCH;
  snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
  fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return errno == ENOENT ? -ESRCH : -errno;
  for (;;) {
    ssize_t r = read(fd, buf + n, sizeof buf - 1 - n);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      rc = errno == ESRCH ? -ESRCH : -errno;
      goto out;
    }
    if (r == 0 || (n += (size_t)r) == sizeof buf - 1) break;
  }
  buf[n] = 0;
  char *p = strrchr(buf, ')');
  if (!p) {
    rc = -EINVAL;
    goto out;
  }
  p++;
  /* Field 3 is the first token after ')'; field 22 the twentieth. */
  for (int field = 3; field <= 22; field++) {
    while (*p == ' ') p++;
    if (!*p || *p == '\n') {
      rc = -EINVAL;
      goto out;
    }
    if (field == 3) {
      *state = *p;
    } else if (field == 22) {
      char *end;
      errno = 0;
      unsigned long long v = strtoull(p, &end, 10);
      if (end == p || errno || (*end != ' ' && *end != '\n' && *end != 0)) {
        rc = -EINVAL;
        goto out;
      }
      *start_time = v;
      break;
    }
    while (*p && *p != ' ' && *p != '\n') p++;
  }
out:
  bh__close(fd);
  return rc;
}

int bh__proc_start_time(pid_t pid, uint64_t *out) {
  char state;
  if (!out) return -EINVAL;
  return bh__proc_stat(pid, &state, out);
}

/* Whether the process that wrote (pid, start_time) still runs.  A zombie
 * counts as gone (its memory is); a /proc we cannot read (hidepid) counts
 * as alive, so we never reap what we cannot judge. */
int bh__alive(pid_t pid, uint64_t start_time) {
#ifdef FUZZING_BUILD_MODE_UNSAFE_FOR_PRODUCTION
  /* Fuzz builds: whether an image's record is alive is decided by the
   * record itself (internal.h), the same on every run, without /proc. */
  return pid > 0 && start_time == BH__FUZZ_START_TIME(pid);
#else
  char state = 0;
  uint64_t st = 0;
  int rc = bh__proc_stat(pid, &state, &st);
  if (rc == -ESRCH) return 0;
  if (rc < 0) return 1;
  if (state == 'Z' || state == 'X') return 0;
  return st == start_time;
#endif
}

/* ------------------------------------------------------------- seqlock */

static inline void bh__cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  __asm__ __volatile__("yield");
#endif
}

/* Spin briefly, then yield, then sleep: a writer preempted mid-write gets
 * its CPU back within a scheduler tick or so; the whole budget is ~40 ms. */
static inline void bh__backoff(int i) {
  if (i < BH__SPINS_BUSY) {
    bh__cpu_relax();
  } else if (i < BH__SPINS_YIELD) {
    sched_yield();
  } else {
    struct timespec ts = {0, 50000};
    nanosleep(&ts, NULL);
  }
}

/* Opens a write section.  A slot left odd by a dead writer stays odd. */
static void bh__write_begin(bh__slot *s) {
  uint32_t q = atomic_load_explicit(&s->seq, memory_order_relaxed);
  if (!(q & 1)) atomic_store_explicit(&s->seq, q + 1, memory_order_relaxed);
  atomic_thread_fence(memory_order_release);
}

static void bh__write_end(bh__slot *s) {
  uint32_t q = atomic_load_explicit(&s->seq, memory_order_relaxed);
  atomic_store_explicit(&s->seq, (q | 1u) + 1, memory_order_release);
}

/* Copies a slot's body consistently.  0, or -EAGAIN after BH__SPINS tries. */
static int bh__slot_copy(const bh__slot *s, bh__body *out) {
  for (int i = 0; i < BH__SPINS; i++) {
    uint32_t q1 = atomic_load_explicit(&s->seq, memory_order_acquire);
    if (!(q1 & 1)) {
      memcpy(out, &s->body, sizeof *out);
      atomic_thread_fence(memory_order_acquire);
      if (atomic_load_explicit(&s->seq, memory_order_relaxed) == q1) return 0;
    }
    bh__backoff(i);
  }
  return -EAGAIN;
}

#define BH__LOAD(field) __atomic_load_n(&(field), __ATOMIC_RELAXED)

/* ------------------------------------------------------------- the mutex */

int bh__ledger_lock(bh_ledger *l) {
  /* Bounded: a holder that is alive but stopped (SIGSTOP, a debugger, a
   * hung worker its host has not killed yet) must not stop every bulkhead
   * process on the machine.  The timeout is CLOCK_REALTIME's (that is
   * what pthread_mutex_timedlock takes); a clock step only changes how
   * long one wait lasts. */
  struct timespec until;
  clock_gettime(CLOCK_REALTIME, &until);
  until.tv_sec += BH__WAIT_MS / 1000;
  until.tv_nsec += (long)(BH__WAIT_MS % 1000) * 1000000L;
  if (until.tv_nsec >= 1000000000L) {
    until.tv_sec++;
    until.tv_nsec -= 1000000000L;
  }
  int rc;
  do rc = pthread_mutex_timedlock(&l->head->mu, &until);
  while (rc == EINTR);
  if (rc == EOWNERDEAD) {
    /* Its owner died inside a critical section; the reaps that follow
     * clean up whatever slot it left half-written. */
    rc = pthread_mutex_consistent(&l->head->mu);
  }
  return -rc;
}

void bh__ledger_unlock(bh_ledger *l) { pthread_mutex_unlock(&l->head->mu); }

/* The mutex if it is free now, else -EBUSY: for readers, which never wait
 * on it (the reap they would do under it is someone else's to do then). */
static int bh__ledger_trylock(bh_ledger *l) {
  int rc = pthread_mutex_trylock(&l->head->mu);
  if (rc == EOWNERDEAD) rc = pthread_mutex_consistent(&l->head->mu);
  return -rc;
}

static void bh__slot_clear(bh__slot *s) {
  bh__write_begin(s);
  memset(&s->body, 0, sizeof s->body);
  bh__write_end(s);
}

/* Under the mutex: frees the records of dead processes and repairs slots a
 * dead writer left odd.  Returns how many records were reaped. */
static int bh__reap_locked(bh_ledger *l) {
  int n = 0;
  for (int i = 0; i < BH_LEDGER_SLOTS; i++) {
    bh__slot *s = &l->slots[i];
    uint32_t state = BH__LOAD(s->body.state);
    if (state != BH__LIVE) {
      if (atomic_load_explicit(&s->seq, memory_order_relaxed) & 1) bh__slot_clear(s);
      continue;
    }
    pid_t pid = BH__LOAD(s->body.pid);
    uint64_t st = BH__LOAD(s->body.start_time);
    /* pid == getpid() too: an earlier process with our pid may have died
     * without leaving; its start time differs from ours. */
    if (!bh__alive(pid, st)) {
      bh__slot_clear(s);
      n++;
    }
  }
  return n;
}

int bh__ledger_forge(bh_ledger *l, int slot, pid_t pid, uint64_t start_time) {
  if (!l || slot < 0 || slot >= BH_LEDGER_SLOTS) return -EINVAL;
  int rc = bh__ledger_lock(l);
  if (rc < 0) return rc;
  bh__slot *s = &l->slots[slot];
  bh__write_begin(s);
  s->body.state = BH__LIVE;
  s->body.pid = pid;
  s->body.start_time = start_time;
  bh__write_end(s);
  bh__ledger_unlock(l);
  return 0;
}

/* ------------------------------------------------------------- open/close */

int bh_ledger_default_path(char *buf, size_t n) {
  if (!buf || !n) return -EINVAL;
  return bh__ledger_home(buf, n, 0); /* rundir.c */
}

/* Open-file-description locks on single bytes of the file (released when
 * the last fd of the description closes, or the process dies):
 *   BH__LOCK_INIT  exclusive, briefly: creation, validation, the decision
 *                  to unlink;
 *   BH__LOCK_OPEN  shared by every open handle for its whole life.
 * flock() cannot hold two independent locks on one file: an opener's
 * exclusive init lock would wait for every open handle to close. */
#define BH__LOCK_INIT 0
#define BH__LOCK_OPEN 1

/* Takes (or drops) a one-byte lock.  wait 0: one try (-EAGAIN when held
 * elsewhere); wait 1: retried for at most BH__LOCK_WAIT_MS, like the
 * mutex (holders keep these locks for microseconds; one that stays is a
 * stopped process), then -ETIMEDOUT.  Polled, because F_OFD_SETLKW has no
 * timeout. */
static int bh__lock_byte(int fd, short type, off_t byte, int wait) {
  struct flock fl = {.l_type = type, .l_whence = SEEK_SET, .l_start = byte, .l_len = 1};
  int64_t until = wait ? bh_now_ns() + (int64_t)BH__WAIT_MS * 1000000 : 0;
  for (int i = 0;; i++) {
    fl.l_type = type;
    if (fcntl(fd, F_OFD_SETLK, &fl) == 0) return 0;
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EACCES) return -errno;
    if (!wait) return -EAGAIN;
    if (bh_now_ns() >= until) return -ETIMEDOUT;
    struct timespec ts = {0, (i < 10 ? 100 : 2000) * 1000L}; /* 0.1 ms, then 2 ms */
    nanosleep(&ts, NULL);
  }
}

static int bh__check_file(int fd, struct stat *st) {
  if (fstat(fd, st) < 0) return -errno;
  if (!S_ISREG(st->st_mode)) return -EINVAL;
  if (st->st_uid != geteuid()) return -EPERM;
  if (st->st_mode & (S_IRWXG | S_IRWXO)) return -EACCES;
  return 0;
}

static void bh__head_init(bh__head *h) {
  pthread_mutexattr_t a;
  pthread_mutexattr_init(&a);
  pthread_mutexattr_setpshared(&a, PTHREAD_PROCESS_SHARED);
  pthread_mutexattr_setrobust(&a, PTHREAD_MUTEX_ROBUST);
  pthread_mutex_init(&h->mu, &a);
  pthread_mutexattr_destroy(&a);
  h->version = BH_LEDGER_VERSION;
  h->head_bytes = BH__HEAD_BYTES;
  h->record_bytes = (uint32_t)sizeof(bh__slot);
  h->record_count = BH_LEDGER_SLOTS;
  h->mutex_bytes = (uint32_t)sizeof(pthread_mutex_t);
  atomic_thread_fence(memory_order_release);
  memcpy(h->magic, BH__MAGIC, sizeof h->magic);
}

/* Validates a header from its first `got` bytes (at least the fields
 * before the mutex are needed) in a file of `size` bytes.  1: all-zero
 * magic at full size (creator died mid-init), 0: valid, else -BH_ELEDGER /
 * -BH_ELEDGERVER.  Shared by the file and the in-memory opener, so the
 * fuzzer checks what bh_ledger_open checks. */
static int bh__head_valid(const void *p, size_t got, uint64_t size) {
  bh__head h;
  if (size < offsetof(bh__head, mu) || got < offsetof(bh__head, mu)) return -BH_ELEDGER;
  memcpy(&h, p, offsetof(bh__head, mu));
  static const char zero[8];
  if (memcmp(h.magic, zero, sizeof zero) == 0 && size == BH__FILE_BYTES) return 1;
  if (memcmp(h.magic, BH__MAGIC, sizeof h.magic) != 0) return -BH_ELEDGER;
  if (h.version != BH_LEDGER_VERSION) return -BH_ELEDGERVER;
  if (h.head_bytes != BH__HEAD_BYTES || h.record_bytes != sizeof(bh__slot) ||
      h.record_count != BH_LEDGER_SLOTS || h.mutex_bytes != sizeof(pthread_mutex_t) ||
      size != BH__FILE_BYTES)
    return -BH_ELEDGER;
  return 0;
}

/* Checks an existing file's header, read with pread (a short file must not
 * be mapped).  Returns as bh__head_valid. */
static int bh__head_check(int fd, off_t size) {
  char buf[offsetof(bh__head, mu)];
  ssize_t r;
  if (size < (off_t)sizeof buf) return -BH_ELEDGER;
  while ((r = pread(fd, buf, sizeof buf, 0)) < 0 && errno == EINTR) {
  }
  if (r < 0) return -errno;
  return bh__head_valid(buf, (size_t)r, (uint64_t)size);
}

/* One attempt at opening, validating (or creating) and mapping the file.
 * Returns 0, 1 when the file turned out unlinked (try again), or an error. */
static int bh__attach(bh_ledger *l) {
  int fd = -1, rc, init = 0, created = 0;
  void *map = MAP_FAILED;
  struct stat st;
  fd = open(l->path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) {
    rc = -errno;
    goto err;
  }
  if ((rc = bh__check_file(fd, &st)) < 0) goto err;
  if ((rc = bh__lock_byte(fd, F_WRLCK, BH__LOCK_INIT, 1)) < 0) goto err;
  if (fstat(fd, &st) < 0) {
    rc = -errno;
    goto err;
  }
  if (st.st_nlink == 0) {
    rc = 1;
    goto err;
  }
  if (st.st_size == 0) {
    created = 1;
    if (ftruncate(fd, (off_t)BH__FILE_BYTES) < 0) {
      rc = -errno;
      goto err;
    }
    init = 1;
  } else {
    rc = bh__head_check(fd, st.st_size);
    if (rc < 0) goto err;
    init = rc;
  }
  map = mmap(NULL, BH__FILE_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (map == MAP_FAILED) {
    rc = -errno;
    goto err;
  }
  if (init) {
    memset(map, 0, BH__FILE_BYTES); /* a dead creator may have left anything */
    bh__head_init(map);
  }
  /* Never waits: a closer holds OPEN exclusively only under INIT. */
  if ((rc = bh__lock_byte(fd, F_RDLCK, BH__LOCK_OPEN, 1)) < 0) goto err;
  if ((rc = bh__lock_byte(fd, F_UNLCK, BH__LOCK_INIT, 0)) < 0) goto err;
  l->fd = fd;
  l->head = map;
  l->slots = (bh__slot *)((char *)map + BH__HEAD_BYTES);
  return 0;
err:
  if (map != MAP_FAILED) munmap(map, BH__FILE_BYTES);
  if (created && rc < 0) {
    struct stat now;
    if (stat(l->path, &now) == 0 && now.st_ino == st.st_ino && now.st_dev == st.st_dev)
      unlink(l->path); /* ours, and no one got past our exclusive lock */
  }
  if (fd >= 0) bh__close(fd);
  return rc;
}

int bh_ledger_open(bh_ledger **out, const char *path) {
  char def[PATH_MAX];
  bh_ledger *l = NULL;
  int rc;
  if (!out) return -EINVAL;
  *out = NULL;
  if (!path) {
    rc = bh__ledger_home(def, sizeof def, 1); /* and its private directory made */
    if (rc < 0) return rc;
    path = def;
  }
  size_t len = strlen(path);
  if (len == 0) return -EINVAL;
  if (len >= PATH_MAX) return -ENAMETOOLONG;
  l = calloc(1, sizeof *l + len + 1);
  if (!l) return -ENOMEM;
  memcpy(l->path, path, len + 1);
  l->fd = -1;
  l->opener = getpid();
  atomic_init(&l->joined_pid, 0);
  atomic_init(&l->slot, -1);
  rc = 1;
  for (int i = 0; i < BH__OPEN_TRIES && rc == 1; i++) {
    /* Lost to a closer that unlinked the file first: others opening and
     * closing in a tight loop can win again and again, so each retry waits
     * a little longer (up to 1 ms, ~40 ms in all), staggered by pid. */
    if (i) {
      long us = (i < 10 ? 1L << i : 1000) + (long)(getpid() % 97);
      struct timespec ts = {0, us * 1000};
      nanosleep(&ts, NULL);
    }
    rc = bh__attach(l);
  }
  if (rc == 1) rc = -EAGAIN;
  if (rc < 0) goto err;
  pthread_mutex_init(&l->wmu, NULL);
  *out = l;
  return 0;
err:
  free(l);
  return rc;
}

int bh__ledger_open_mem(bh_ledger **out, void *image, size_t len) {
  bh_ledger *l = NULL;
  if (!out) return -EINVAL;
  *out = NULL;
  if (!image) return -EINVAL;
  int rc = bh__head_valid(image, len, len);
  if (rc < 0) return rc;
  l = calloc(1, sizeof *l + 1);
  if (!l) return -ENOMEM;
  if (rc == 1) { /* as bh__attach does for a creator that died mid-way */
    memset(image, 0, BH__FILE_BYTES);
    bh__head_init(image);
  }
  l->fd = -1;
  l->opener = getpid();
  l->head = image;
  l->slots = (bh__slot *)((char *)image + BH__HEAD_BYTES);
  atomic_init(&l->joined_pid, 0);
  atomic_init(&l->slot, -1);
  pthread_mutex_init(&l->wmu, NULL);
  *out = l;
  return 0;
}

const char *bh_ledger_path(const bh_ledger *l) { return l ? l->path : NULL; }

static int bh__count_live(bh_ledger *l) {
  int n = 0;
  for (int i = 0; i < BH_LEDGER_SLOTS; i++)
    if (BH__LOAD(l->slots[i].body.state) == BH__LIVE) n++;
  return n;
}

void bh_ledger_close(bh_ledger *l) {
  if (!l) return;
  /* A forked child that joined through its copy of the handle leaves too. */
  if (atomic_load(&l->joined_pid) == getpid()) bh_ledger_leave(l);
  if (l->opener == getpid() && l->fd < 0) {
    pthread_mutex_destroy(&l->wmu); /* an image in memory: the caller's */
  } else if (l->opener == getpid()) {
    /* Under INIT (no opener between its validation and its OPEN lock),
     * OPEN exclusive without waiting means no other handle anywhere has
     * the file open. */
    if (bh__lock_byte(l->fd, F_WRLCK, BH__LOCK_INIT, 1) == 0 &&
        bh__lock_byte(l->fd, F_WRLCK, BH__LOCK_OPEN, 0) == 0 && bh__ledger_lock(l) == 0) {
      bh__reap_locked(l);
      int live = bh__count_live(l);
      bh__ledger_unlock(l);
      struct stat mine, now;
      if (live == 0 && fstat(l->fd, &mine) == 0 && stat(l->path, &now) == 0 &&
          mine.st_ino == now.st_ino && mine.st_dev == now.st_dev)
        unlink(l->path);
    }
    /* Dropped explicitly: a forked child may share this open file
     * description, and its copy of the fd would keep them held. */
    struct flock fl = {.l_type = F_UNLCK, .l_whence = SEEK_SET, .l_start = 0, .l_len = 0};
    fcntl(l->fd, F_OFD_SETLK, &fl);
    pthread_mutex_destroy(&l->wmu);
  }
  /* In a forked child the fd shares the parent's open file description:
   * closing our copy of the fd leaves the parent's locks alone. */
  if (l->fd >= 0) {
    munmap(l->head, BH__FILE_BYTES);
    bh__close(l->fd);
  }
  free(l);
}

/* ------------------------------------------------------------- join/leave */

/* A string argument: NULL is "", one that does not fit `cap` (NUL
 * included) is -ENAMETOOLONG. */
static int bh__str_ok(const char *s, size_t cap) {
  return !s || strnlen(s, cap) < cap ? 0 : -ENAMETOOLONG;
}

static void bh__str_put(char *dst, size_t cap, const char *s) {
  size_t n = s ? strnlen(s, cap - 1) : 0;
  memcpy(dst, s ? s : "", n);
  memset(dst + n, 0, cap - n);
}

/* Whether slot i holds the record of (pid, start_time).  Under the mutex
 * or by its owner: those fields change only under the mutex. */
static int bh__slot_is(bh_ledger *l, int i, pid_t pid, uint64_t start_time) {
  bh__slot *s = &l->slots[i];
  return BH__LOAD(s->body.state) == BH__LIVE && BH__LOAD(s->body.pid) == pid &&
         BH__LOAD(s->body.start_time) == start_time;
}

int bh_ledger_join(bh_ledger *l, int role, const char *pack, const char *interpreter,
                   uint32_t generation, pid_t host_pid) {
  int rc, slot = -1, fresh = 0, locked = 0;
  uint64_t st;
  if (!l || role < BH_ROLE_HOST || role > BH_ROLE_TOOL || host_pid < 0) return -EINVAL;
  if ((rc = bh__str_ok(pack, BH_LEDGER_PACK_MAX)) < 0 ||
      (rc = bh__str_ok(interpreter, BH_LEDGER_INTERP_MAX)) < 0)
    return rc;
  pid_t me = getpid();
  if ((rc = bh__proc_start_time(me, &st)) < 0) return rc;
  pthread_mutex_lock(&l->wmu);
  if ((rc = bh__ledger_lock(l)) < 0) goto out;
  locked = 1;
  /* Already there (a second join, another handle of this process)? */
  for (int i = 0; i < BH_LEDGER_SLOTS && slot < 0; i++)
    if (bh__slot_is(l, i, me, st)) slot = i;
  /* Else a free slot; only a full ledger pays for a reap. */
  for (int pass = 0; pass < 2 && slot < 0; pass++) {
    if (pass == 1 && bh__reap_locked(l) == 0) break;
    for (int i = 0; i < BH_LEDGER_SLOTS && slot < 0; i++)
      if (BH__LOAD(l->slots[i].body.state) != BH__LIVE) slot = i, fresh = 1;
  }
  if (slot < 0) {
    rc = -BH_ELEDGERFULL;
    goto out;
  }
  bh__slot *s = &l->slots[slot];
  bh__write_begin(s);
  if (fresh) memset(&s->body, 0, sizeof s->body);
  s->body.pid = me;
  s->body.start_time = st;
  s->body.role = (uint32_t)role;
  s->body.generation = generation;
  s->body.host_pid = host_pid;
  bh__str_put(s->body.pack, sizeof s->body.pack, pack);
  bh__str_put(s->body.interpreter, sizeof s->body.interpreter, interpreter);
  s->body.last_used_ns = (uint64_t)bh_now_ns();
  s->body.state = BH__LIVE;
  bh__write_end(s);
  l->start_time = st;
  atomic_store(&l->slot, slot);
  atomic_store(&l->joined_pid, me);
  rc = slot;
out:
  if (locked) bh__ledger_unlock(l);
  pthread_mutex_unlock(&l->wmu);
  return rc;
}

int bh_ledger_leave(bh_ledger *l) {
  int rc;
  if (!l) return -EINVAL;
  pid_t me = getpid();
  if (atomic_load(&l->joined_pid) != me) return -BH_ENOTJOINED;
  pthread_mutex_lock(&l->wmu);
  int slot = atomic_load(&l->slot);
  if (atomic_load(&l->joined_pid) != me || slot < 0) {
    rc = -BH_ENOTJOINED;
    goto out;
  }
  if ((rc = bh__ledger_lock(l)) < 0) goto out;
  /* Another handle of this process may have left it already. */
  rc = bh__slot_is(l, slot, me, l->start_time) ? 0 : -BH_ENOTJOINED;
  if (rc == 0) bh__slot_clear(&l->slots[slot]);
  bh__ledger_unlock(l);
  atomic_store(&l->slot, -1);
  atomic_store(&l->joined_pid, 0);
out:
  pthread_mutex_unlock(&l->wmu);
  return rc;
}

int bh_ledger_slot(const bh_ledger *l) {
  if (!l) return -EINVAL;
  bh_ledger *m = (bh_ledger *)l;
  if (atomic_load(&m->joined_pid) != getpid()) return -BH_ENOTJOINED;
  int slot = atomic_load(&m->slot);
  return slot >= 0 ? slot : -BH_ENOTJOINED;
}

/* ------------------------------------------------------------- writers */

/* Takes this handle's writer lock and returns our record, or fails with
 * -BH_ENOTJOINED (never joined, a forked child, or the record was freed
 * under us by another handle of this process). */
static int bh__own(bh_ledger *l, bh__slot **out) {
  pid_t me = getpid();
  if (atomic_load(&l->joined_pid) != me) return -BH_ENOTJOINED;
  pthread_mutex_lock(&l->wmu);
  int slot = atomic_load(&l->slot);
  if (atomic_load(&l->joined_pid) != me || slot < 0 || !bh__slot_is(l, slot, me, l->start_time)) {
    pthread_mutex_unlock(&l->wmu);
    return -BH_ENOTJOINED;
  }
  *out = &l->slots[slot];
  return 0;
}

static void bh__own_done(bh_ledger *l) { pthread_mutex_unlock(&l->wmu); }

int bh_ledger_set_run(bh_ledger *l, int run) {
  bh__slot *s;
  if (!l || run < BH_RUN_IDLE || run > BH_RUN_WORKING || run == BH_RUN_STALE) return -EINVAL;
  int rc = bh__own(l, &s);
  if (rc < 0) return rc;
  bh__write_begin(s);
  s->body.run = (uint32_t)run;
  s->body.last_used_ns = (uint64_t)bh_now_ns();
  bh__write_end(s);
  bh__own_done(l);
  return 0;
}

/* Index of the device entry named `name` in our own body, or -1. */
static int bh__dev_find(const bh__body *b, const char *name) {
  uint32_t n = b->n_devices < BH_LEDGER_DEVICES ? b->n_devices : BH_LEDGER_DEVICES;
  for (uint32_t i = 0; i < n; i++)
    if (strncmp(b->devices[i].name, name, BH_LEDGER_DEVICE_MAX) == 0) return (int)i;
  return -1;
}

int bh_ledger_set_device(bh_ledger *l, const bh_ledger_device *d) {
  bh__slot *s;
  if (!l || !d || !d->device[0]) return -EINVAL;
  if (bh__str_ok(d->device, sizeof d->device) < 0) return -ENAMETOOLONG;
  int rc = bh__own(l, &s);
  if (rc < 0) return rc;
  int i = bh__dev_find(&s->body, d->device);
  if (i < 0) {
    if (s->body.n_devices >= BH_LEDGER_DEVICES) {
      rc = -BH_EMODELS;
      goto out;
    }
    i = (int)s->body.n_devices;
  }
  bh__dev e;
  bh__str_put(e.name, sizeof e.name, d->device);
  e.held = d->held_bytes;
  e.pinned = d->pinned_bytes;
  e.pin_ceiling = d->pin_ceiling_bytes;
  e.pager = d->pager_bytes;
  e.floor = d->floor_bytes;
  e.reserve = d->reserve_bytes;
  bh__write_begin(s);
  s->body.devices[i] = e;
  if ((uint32_t)i == s->body.n_devices) s->body.n_devices++;
  bh__write_end(s);
out:
  bh__own_done(l);
  return rc;
}

int bh_ledger_set_model(bh_ledger *l, const bh_ledger_model *m) {
  bh__slot *s;
  if (!l || !m) return -EINVAL;
  if (bh__str_ok(m->name, sizeof m->name) < 0 || bh__str_ok(m->device, sizeof m->device) < 0)
    return -ENAMETOOLONG;
  int rc = bh__own(l, &s);
  if (rc < 0) return rc;
  bh__body *b = &s->body;
  /* Everything that can fail is decided before the write section. */
  int dev = -1, add_dev = 0;
  if (m->device[0]) {
    dev = bh__dev_find(b, m->device);
    if (dev < 0) {
      if (b->n_devices >= BH_LEDGER_DEVICES) {
        rc = -BH_EMODELS;
        goto out;
      }
      dev = (int)b->n_devices;
      add_dev = 1;
    }
  }
  int at = -1;
  uint32_t n = b->n_models < BH_LEDGER_MODELS ? b->n_models : BH_LEDGER_MODELS;
  for (uint32_t i = 0; i < n && at < 0; i++)
    if (b->models[i].id == m->id) at = (int)i;
  if (at < 0) {
    if (n >= BH_LEDGER_MODELS) {
      rc = -BH_EMODELS;
      goto out;
    }
    at = (int)n;
  }
  bh__model e = {.id = m->id, .device = dev < 0 ? BH__NO_DEVICE : (uint32_t)dev,
                 .size = m->size_bytes, .resident = m->resident_bytes};
  bh__str_put(e.name, sizeof e.name, m->name);
  bh__write_begin(s);
  if (add_dev) {
    memset(&b->devices[dev], 0, sizeof b->devices[dev]);
    bh__str_put(b->devices[dev].name, sizeof b->devices[dev].name, m->device);
    b->n_devices++;
  }
  b->models[at] = e;
  if ((uint32_t)at == n) b->n_models = n + 1;
  bh__write_end(s);
out:
  bh__own_done(l);
  return rc;
}

int bh_ledger_drop_model(bh_ledger *l, uint64_t id) {
  bh__slot *s;
  if (!l) return -EINVAL;
  int rc = bh__own(l, &s);
  if (rc < 0) return rc;
  bh__body *b = &s->body;
  uint32_t n = b->n_models < BH_LEDGER_MODELS ? b->n_models : BH_LEDGER_MODELS;
  int at = -1;
  for (uint32_t i = 0; i < n && at < 0; i++)
    if (b->models[i].id == id) at = (int)i;
  if (at < 0) {
    rc = -ENOENT;
    goto out;
  }
  bh__write_begin(s);
  b->models[at] = b->models[n - 1];
  memset(&b->models[n - 1], 0, sizeof b->models[n - 1]);
  b->n_models = n - 1;
  bh__write_end(s);
out:
  bh__own_done(l);
  return rc;
}

int bh_ledger_note_release(bh_ledger *l, uint64_t bytes) {
  bh__slot *s;
  if (!l) return -EINVAL;
  int rc = bh__own(l, &s);
  if (rc < 0) return rc;
  bh__write_begin(s);
  s->body.release_count++;
  s->body.released_bytes += bytes;
  bh__write_end(s);
  bh__own_done(l);
  return 0;
}

/* ------------------------------------------------------------- readers */

/* A consistent body copied into the public form; fields are clamped and
 * strings terminated, so a damaged segment cannot make us over-read. */
static void bh__to_record(int slot, const bh__body *b, bh_ledger_record *r) {
  memset(r, 0, sizeof *r);
  r->slot = slot;
  r->pid = b->pid;
  r->start_time = b->start_time;
  r->role = (int)b->role;
  r->generation = b->generation;
  r->host_pid = b->host_pid;
  bh__str_put(r->pack, sizeof r->pack, b->pack);
  bh__str_put(r->interpreter, sizeof r->interpreter, b->interpreter);
  r->run = (int)b->run;
  r->last_used_ns = b->last_used_ns;
  r->release_count = b->release_count;
  r->released_bytes = b->released_bytes;
  r->n_devices = b->n_devices < BH_LEDGER_DEVICES ? b->n_devices : BH_LEDGER_DEVICES;
  r->n_models = b->n_models < BH_LEDGER_MODELS ? b->n_models : BH_LEDGER_MODELS;
  for (uint32_t i = 0; i < r->n_devices; i++) {
    const bh__dev *d = &b->devices[i];
    bh_ledger_device *o = &r->devices[i];
    /* bh__str_put copies at most cap-1 bytes, so a name that fills its
     * field in the file stays terminated here. */
    bh__str_put(o->device, sizeof o->device, d->name);
    o->held_bytes = d->held;
    o->pinned_bytes = d->pinned;
    o->pin_ceiling_bytes = d->pin_ceiling;
    o->pager_bytes = d->pager;
    o->floor_bytes = d->floor;
    o->reserve_bytes = d->reserve;
  }
  for (uint32_t i = 0; i < r->n_models; i++) {
    const bh__model *m = &b->models[i];
    bh_ledger_model *o = &r->models[i];
    o->id = m->id;
    bh__str_put(o->name, sizeof o->name, m->name);
    if (m->device < r->n_devices) bh__str_put(o->device, sizeof o->device, b->devices[m->device].name);
    o->size_bytes = m->size;
    o->resident_bytes = m->resident;
  }
}

/* Reaps slot i if its owner is dead (the caller found it stuck odd),
 * without waiting for the mutex (-EBUSY if it is held). */
static int bh__reap_if_dead(bh_ledger *l, int i) {
  bh__slot *s = &l->slots[i];
  int rc = bh__ledger_trylock(l);
  if (rc < 0) return rc;
  int dead = BH__LOAD(s->body.state) == BH__LIVE &&
             !bh__alive(BH__LOAD(s->body.pid), BH__LOAD(s->body.start_time));
  if (dead) bh__slot_clear(s);
  bh__ledger_unlock(l);
  return dead;
}

/* Copies slot i: 1 live (copied into *b), 0 free or reaped, -EAGAIN. */
static int bh__read_slot(bh_ledger *l, int i, bh__body *b) {
  int rc = bh__slot_copy(&l->slots[i], b);
  if (rc == -EAGAIN) {
    rc = bh__reap_if_dead(l, i);
    if (rc == -EBUSY) return -EAGAIN; /* someone holds the mutex: shown stale this time */
    if (rc < 0) return rc;
    if (rc == 1) return 0;
    /* Alive: maybe it finished meanwhile. */
    if (bh__slot_copy(&l->slots[i], b) < 0) return -EAGAIN;
  }
  return b->state == BH__LIVE;
}

int bh_ledger_reap(bh_ledger *l) {
  if (!l) return -EINVAL;
  int rc = bh__ledger_lock(l);
  if (rc < 0) return rc;
  rc = bh__reap_locked(l);
  bh__ledger_unlock(l);
  return rc;
}

int bh_ledger_snapshot(bh_ledger *l, bh_ledger_record *out, int max) {
  bh__body b;
  if (!l || max < 0 || (max > 0 && !out)) return -EINVAL;
  /* A snapshot never waits on the mutex (the status page and the web
   * server's routes take one while another process may hold it): held,
   * it reads without reaping, leaving dead owners' records out instead. */
  int rc = bh__ledger_trylock(l);
  int reaped = rc == 0;
  if (reaped) {
    bh__reap_locked(l);
    bh__ledger_unlock(l);
  } else if (rc != -EBUSY) {
    return rc;
  }
  int n = 0;
  for (int i = 0; i < BH_LEDGER_SLOTS && n < max; i++) {
    if (BH__LOAD(l->slots[i].body.state) != BH__LIVE &&
        !(atomic_load_explicit(&l->slots[i].seq, memory_order_relaxed) & 1))
      continue;
    rc = bh__read_slot(l, i, &b);
    if (rc == -EAGAIN) {
      /* Its owner is alive and stayed mid-write past the retries (a
       * stopped process): that record is shown stale, the rest as usual. */
      bh_ledger_record *r = &out[n++];
      memset(r, 0, sizeof *r);
      r->slot = i;
      r->pid = BH__LOAD(l->slots[i].body.pid);
      r->run = BH_RUN_STALE;
      continue;
    }
    if (rc < 0) return rc;
    if (rc == 1 && (reaped || bh__alive(b.pid, b.start_time))) bh__to_record(i, &b, &out[n++]);
  }
  return n;
}

int bh_ledger_read(bh_ledger *l, pid_t pid, bh_ledger_record *out) {
  bh__body b;
  if (!l || !out || pid <= 0) return -EINVAL;
  for (int i = 0; i < BH_LEDGER_SLOTS; i++) {
    if (BH__LOAD(l->slots[i].body.pid) != pid) continue;
    int rc = bh__read_slot(l, i, &b);
    if (rc < 0) return rc;
    if (rc == 0 || b.pid != pid) continue;
    if (!bh__alive(b.pid, b.start_time)) {
      rc = bh__reap_if_dead(l, i);
      /* Dead either way; -EBUSY only means someone else reaps it. */
      if (rc < 0 && rc != -EBUSY) return rc;
      continue;
    }
    bh__to_record(i, &b, out);
    return 0;
  }
  return -ESRCH;
}

/* What one lock-free reader reads from pid's slot s: 0 done, -ESRCH the
 * slot is not pid's (the next is tried), anything else the answer. */
typedef int (*bh__slot_reader)(const bh__slot *s, pid_t pid, void *ctx);

/* pid's live slot found and read by `read`, lock-free: *slot_hint (where
 * it was found last; -1 unknown, may be NULL) first, then every slot with
 * that pid; the hint kept up.  -ESRCH when no slot is pid's. */
static int bh__read_pid_slot(bh_ledger *l, pid_t pid, int *slot_hint, bh__slot_reader read, void *ctx) {
  int hint = slot_hint ? *slot_hint : -1;
  if (hint >= 0 && hint < BH_LEDGER_SLOTS) {
    int rc = read(&l->slots[hint], pid, ctx);
    if (rc != -ESRCH) return rc;
  }
  for (int i = 0; i < BH_LEDGER_SLOTS; i++) {
    if (i == hint || BH__LOAD(l->slots[i].body.pid) != pid) continue;
    int rc = read(&l->slots[i], pid, ctx);
    if (rc == -ESRCH) continue;
    if (slot_hint) *slot_hint = i;
    return rc;
  }
  if (slot_hint) *slot_hint = -1;
  return -ESRCH;
}

typedef struct {
  uint64_t id, size, resident;
} bh__model_ask;

/* One model's sizes, seqlocked: 0 found, -ENOENT no such model, -ESRCH
 * the slot is not pid's, -EAGAIN its owner stayed mid-write. */
static int bh__model_in_slot(const bh__slot *s, pid_t pid, void *ctx) {
  bh__model_ask *ask = ctx;
  for (int i = 0; i < BH__SPINS; i++) {
    uint32_t q1 = atomic_load_explicit(&s->seq, memory_order_acquire);
    if (!(q1 & 1)) {
      int rc = -ENOENT;
      uint64_t sz = 0, res = 0;
      if (BH__LOAD(s->body.state) != BH__LIVE || BH__LOAD(s->body.pid) != pid) {
        rc = -ESRCH;
      } else {
        uint32_t n = BH__LOAD(s->body.n_models);
        if (n > BH_LEDGER_MODELS) n = BH_LEDGER_MODELS;
        for (uint32_t k = 0; k < n; k++) {
          if (BH__LOAD(s->body.models[k].id) == ask->id) {
            sz = BH__LOAD(s->body.models[k].size);
            res = BH__LOAD(s->body.models[k].resident);
            rc = 0;
            break;
          }
        }
      }
      atomic_thread_fence(memory_order_acquire);
      if (atomic_load_explicit(&s->seq, memory_order_relaxed) == q1) {
        if (rc == 0) ask->size = sz, ask->resident = res;
        return rc;
      }
    }
    bh__backoff(i);
  }
  return -EAGAIN;
}

/* The slot's write counter, where it is pid's live record. */
static int bh__version_in_slot(const bh__slot *s, pid_t pid, void *ctx) {
  uint32_t q = atomic_load_explicit(&s->seq, memory_order_acquire);
  if (BH__LOAD(s->body.state) != BH__LIVE || BH__LOAD(s->body.pid) != pid) return -ESRCH;
  *(uint32_t *)ctx = q;
  return 0;
}

int bh_ledger_version(bh_ledger *l, pid_t pid, int *slot_hint, uint32_t *version) {
  if (!l || pid <= 0 || !version) return -EINVAL;
  return bh__read_pid_slot(l, pid, slot_hint, bh__version_in_slot, version);
}

int bh_ledger_model_read(bh_ledger *l, pid_t pid, uint64_t model_id, int *slot_hint,
                         uint64_t *size_bytes, uint64_t *resident_bytes) {
  if (!l || pid <= 0 || !size_bytes || !resident_bytes) return -EINVAL;
  bh__model_ask ask = {.id = model_id};
  int rc = bh__read_pid_slot(l, pid, slot_hint, bh__model_in_slot, &ask);
  if (rc == 0) *size_bytes = ask.size, *resident_bytes = ask.resident;
  return rc;
}
