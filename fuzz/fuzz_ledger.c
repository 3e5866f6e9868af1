/*
 * fuzz_ledger.c -- the ledger reader on arbitrary file contents.
 *
 * An input is the content of a ledger file, opened twice with
 * bh__ledger_open_mem, which validates the header with the same function
 * bh_ledger_open uses on a file (ledger.c): first as it is, copied to a
 * buffer of exactly its size (ASan then sees any read past the file's
 * end); then, when it is shorter than a ledger file, as the start of a
 * full-size file whose rest is zero (a global buffer of exactly the
 * file's size, with ASan's redzone after it).  Every file image is still
 * an input (a full-size one is itself), but the usual ones, a few live
 * records and empty slots, are short: the fuzzer runs many times faster
 * than on 200 KiB inputs.  On an image the opener accepts, the readers
 * run: bh_ledger_snapshot (which reaps first), bh_ledger_read and
 * bh_ledger_model_read for every record found and for pids and ids the
 * input names, then a reap and a second snapshot.
 * Checked: an input the opener refuses gets -BH_ELEDGER or
 * -BH_ELEDGERVER; one it accepts is exactly the file's size; every
 * record a reader returns is clamped (counts within their arrays, strings
 * terminated, a model's device one of the record's devices), the readers
 * agree with each other, return only their documented codes, and a
 * second snapshot finds the same records.
 *
 * The fuzz build (FUZZING_BUILD_MODE_UNSAFE_FOR_PRODUCTION) makes a record
 * alive iff its start_time is BH__FUZZ_START_TIME(pid) (internal.h), so
 * an input decides which of its records survive the reaper, the same on
 * every run, and makes the seqlock's retry budget a few tries (no other
 * process writes the image, so waiting would change nothing).
 *
 * Not fuzzed: the robust mutex in the header (bytes 32 .. 32 +
 * sizeof(pthread_mutex_t)) is overwritten with a freshly initialised one
 * before opening.  Those bytes are glibc's lock state, not data the
 * reader parses; a mutex scribbled over by a process of the same uid can
 * make pthread_mutex_lock wait forever (an owner tid that never unlocks)
 * whatever bulkhead does, like any process-shared lock.
 */
#include "fuzz.h"
#include "bulkhead/ledger.h"
#include "src/core/internal.h"

#include <pthread.h>
#include <string.h>

#define FILE_BYTES 2248704u /* the layout's size, ledger.c */
#define MUTEX_AT 32u

static pthread_mutex_t fresh; /* the bytes a creator writes */

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc, (void)argv;
  pthread_mutexattr_t a;
  pthread_mutexattr_init(&a);
  pthread_mutexattr_setpshared(&a, PTHREAD_PROCESS_SHARED);
  pthread_mutexattr_setrobust(&a, PTHREAD_MUTEX_ROBUST);
  pthread_mutex_init(&fresh, &a);
  pthread_mutexattr_destroy(&a);
  return 0;
}

static int terminated(const char *s, size_t cap) { return memchr(s, 0, cap) != NULL; }

static void check_record(const bh_ledger_record *r) {
  FUZZ_CHECK(r->slot >= 0 && r->slot < BH_LEDGER_SLOTS);
  if (r->run == BH_RUN_STALE) { /* left mid-write by a live owner: slot and pid only */
    FUZZ_CHECK(r->n_devices == 0 && r->n_models == 0 && r->pack[0] == 0 && r->start_time == 0);
    return;
  }
  FUZZ_CHECK(r->pid > 0 && r->start_time == BH__FUZZ_START_TIME(r->pid)); /* alive */
  FUZZ_CHECK(terminated(r->pack, sizeof r->pack));
  FUZZ_CHECK(terminated(r->interpreter, sizeof r->interpreter));
  FUZZ_CHECK(r->n_devices <= BH_LEDGER_DEVICES && r->n_models <= BH_LEDGER_MODELS);
  for (uint32_t i = 0; i < r->n_devices; i++)
    FUZZ_CHECK(terminated(r->devices[i].device, sizeof r->devices[i].device));
  for (uint32_t i = 0; i < r->n_models; i++) {
    const bh_ledger_model *m = &r->models[i];
    FUZZ_CHECK(terminated(m->name, sizeof m->name) && terminated(m->device, sizeof m->device));
    int known = m->device[0] == 0;
    for (uint32_t k = 0; k < r->n_devices && !known; k++)
      known = strcmp(m->device, r->devices[k].device) == 0;
    FUZZ_CHECK(known);
  }
  /* Entries past the counts are zero: nothing stale leaks out. */
  static const bh_ledger_device zdev;
  static const bh_ledger_model zmod;
  for (uint32_t i = r->n_devices; i < BH_LEDGER_DEVICES; i++)
    FUZZ_CHECK(memcmp(&r->devices[i], &zdev, sizeof zdev) == 0);
  for (uint32_t i = r->n_models; i < BH_LEDGER_MODELS; i++)
    FUZZ_CHECK(memcmp(&r->models[i], &zmod, sizeof zmod) == 0);
}

/* Whether pid appears in exactly one of the n records. */
static int unique_pid(const bh_ledger_record *recs, int n, pid_t pid) {
  int k = 0;
  for (int i = 0; i < n; i++) k += recs[i].pid == pid;
  return k == 1;
}

static bh_ledger_record recs[BH_LEDGER_SLOTS], again[BH_LEDGER_SLOTS], one;
static _Alignas(64) uint8_t padded[FILE_BYTES];

/* Opens img[0..size) and, if the opener accepts it, reads it. */
static void one_image(uint8_t *img, size_t size) {
  bh_ledger *l = NULL;
  if (size >= MUTEX_AT + sizeof fresh) memcpy(img + MUTEX_AT, &fresh, sizeof fresh);
  int rc = bh__ledger_open_mem(&l, img, size);
  if (rc < 0) {
    FUZZ_RC_IN(rc, -BH_ELEDGER, -BH_ELEDGERVER);
    FUZZ_CHECK(l == NULL);
    return;
  }
  FUZZ_CHECK(size == FILE_BYTES);

  int n = bh_ledger_snapshot(l, recs, BH_LEDGER_SLOTS);
  if (n < 0) {
    FUZZ_RC_IN(n, -EAGAIN); /* a live record left mid-write */
    goto out;
  }
  FUZZ_CHECK(n <= BH_LEDGER_SLOTS);
  for (int i = 0; i < n; i++) {
    check_record(&recs[i]);
    if (i) FUZZ_CHECK(recs[i].slot > recs[i - 1].slot);
    rc = bh_ledger_read(l, recs[i].pid, &one);
    FUZZ_RC_IN(rc, 0, -EAGAIN);
    if (rc == 0) {
      check_record(&one);
      FUZZ_CHECK(one.pid == recs[i].pid);
      if (unique_pid(recs, n, recs[i].pid)) FUZZ_CHECK(memcmp(&one, &recs[i], sizeof one) == 0);
    }
    for (uint32_t k = 0; k < recs[i].n_models; k++) {
      const bh_ledger_model *m = &recs[i].models[k];
      int hint = -1;
      uint64_t sz = 0, res = 0;
      rc = bh_ledger_model_read(l, recs[i].pid, m->id, &hint, &sz, &res);
      FUZZ_RC_IN(rc, 0, -ENOENT, -EAGAIN);
      if (rc == 0 && unique_pid(recs, n, recs[i].pid)) {
        FUZZ_CHECK(hint == recs[i].slot);
        /* The first entry with that id is the one found. */
        uint32_t first = 0;
        while (recs[i].models[first].id != m->id) first++;
        FUZZ_CHECK(sz == recs[i].models[first].size_bytes &&
                   res == recs[i].models[first].resident_bytes);
      }
    }
  }
  /* Pids and ids the input names, and hints that are out of range. */
  for (size_t off = 4096; off + 4384 <= size && off < 4096 + 8 * 4384u; off += 4384) {
    pid_t pid;
    uint64_t id, sz, res;
    memcpy(&pid, img + off + 12, sizeof pid); /* seq, reserved, state, pid */
    memcpy(&id, img + off + 576, sizeof id); /* the first model's id */
    int hint = (int)(int8_t)img[off + 1] * 3;
    rc = bh_ledger_model_read(l, pid, id, &hint, &sz, &res);
    FUZZ_RC_IN(rc, 0, -ENOENT, -ESRCH, -EAGAIN, -EINVAL);
    if (pid > 0) {
      rc = bh_ledger_read(l, pid, &one);
      FUZZ_RC_IN(rc, 0, -ESRCH, -EAGAIN);
      if (rc == 0) check_record(&one);
    }
  }
  /* Everything dead went at the first snapshot. */
  FUZZ_CHECK(bh_ledger_reap(l) == 0);
  int m = bh_ledger_snapshot(l, again, BH_LEDGER_SLOTS);
  FUZZ_CHECK(m == n);
  FUZZ_CHECK(memcmp(recs, again, sizeof recs[0] * (size_t)n) == 0);
out:
  bh_ledger_close(l);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size == FILE_BYTES) { /* the common buffer has the exact size */
    memcpy(padded, data, size);
    one_image(padded, size);
    return 0;
  }
  uint8_t *img = malloc(size ? size : 1);
  FUZZ_CHECK(img);
  memcpy(img, data, size);
  one_image(img, size);
  free(img);
  if (size < FILE_BYTES) {
    memcpy(padded, data, size);
    memset(padded + size, 0, FILE_BYTES - size);
    one_image(padded, FILE_BYTES);
  }
  return 0;
}
