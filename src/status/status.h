/*
 * status.h -- the status library: a snapshot of the machine (every record
 * of the shared ledger, next to what each device has: RAM through
 * bh_ram_read, GPUs through NVML) and its two renderings, the table for
 * people and the JSON document; plus the pure text helpers they share.
 *
 * Two programs link it: the `bulkhead` command (tools/: `status`, `top`)
 * and the extension (_native.status_json: ComfyUI's GET /bulkhead/status),
 * so the command and the web panel can never disagree.  It uses the core
 * only (DESIGN section 2: dependencies point down).
 *
 * Not library API (nothing is BH_EXTERN: it is linked statically into both
 * programs).  Functions follow the house conventions all the same: int
 * returns >= 0 / -errno, text appended to a caller's bh_buf (the codec's
 * growable buffer: its first allocation failure is sticky in b->err, so a
 * caller checks once at the end).
 */
#ifndef BULKHEAD_STATUS_H
#define BULKHEAD_STATUS_H

#include "bulkhead/bulkhead.h"
#include "bulkhead/ledger.h"
#include "bulkhead/probe.h"

#include <limits.h>
#include <stddef.h>
#include <stdint.h>

/* The version of the JSON document `status --json` prints.  Bumped only
 * when a field changes meaning or goes away; new fields do not bump it. */
#define BH_STATUS_JSON_SCHEMA 1

/* ------------------------------------------------------------ text.c */

/* Formats n for people: "0 B", "1023 B", "1.0 KiB", "512.0 MiB",
 * "1023.9 GiB", up to EiB (at most 10 characters).  Returns the length
 * written into buf (NUL-terminated; truncated to len - 1). */
int bh_text_bytes_format(uint64_t n, char *buf, size_t len);

/* Formats an idle time: "0s", "59s", "5m03s", "2h05m", "3d04h"; a negative
 * value (unknown) gives "-".  Returns the length written. */
int bh_text_idle_format(int64_t ns, char *buf, size_t len);

/* Appends printf-style text.  Returns 0 or the buffer's sticky error. */
int bh_text_appendf(bh_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Appends a JSON string literal (quotes included) for the n bytes at s:
 * '"' and '\\' escaped, control characters (< 0x20, and 0x7f) as \n, \t,
 * ... or \u00XX, every byte that is not part of valid UTF-8 (overlongs,
 * surrogates, beyond U+10FFFF, truncated sequences) as \ufffd; valid
 * UTF-8 passes through.  The output is always valid JSON. */
int bh_text_json_str(bh_buf *b, const char *s, size_t n);

/* Copies the NUL-terminated src into dst for a terminal: at most `cols`
 * characters (code points), control characters and invalid UTF-8 replaced
 * by '?' (a pack name must never move the cursor), and when src is longer
 * its last character shown is '~'.  With pad, pads with blanks to exactly
 * cols characters.  dst gets at most 4 * cols + 1 bytes (dstlen must allow
 * that or the text is cut sooner).  Returns the characters written. */
int bh_text_fit(char *dst, size_t dstlen, const char *src, unsigned cols, int pad);

/* Cuts the line (no newline in it) that starts at b->data + start so that
 * it spans at most `cols` characters; escape sequences (ESC [ ... final
 * byte) count as none.  Returns the characters left. */
unsigned bh_text_line_clip(bh_buf *b, size_t start, unsigned cols);

/* ---------------------------------------------------------- status.c */

/* One device's capacity as the probes read it now. */
typedef struct bh_status_device {
  char device[BH_LEDGER_DEVICE_MAX]; /* "cpu", "cuda:<nvml index>" */
  uint64_t total_bytes, free_bytes;
  const char *source;                /* "meminfo", "cgroup", "nvml" (static) */
  int index;                         /* NVML index, -1 for cpu */
  char uuid[BH_GPU_UUID_MAX];        /* "" for cpu */
  char name[BH_GPU_NAME_MAX];        /* "NVIDIA H200"; "" for cpu */
} bh_status_device;

#define BH_STATUS_DEVICES_MAX 33 /* cpu + 32 GPUs */

/* Everything `status` and `top` show, taken at one moment. */
typedef struct bh_status_snap {
  char ledger_path[PATH_MAX];
  int ledger_present;           /* 0: no ledger file (nobody ever joined) */
  int64_t now_ns;               /* CLOCK_MONOTONIC when taken */
  int n_records;
  bh_ledger_record *records;    /* owned; slot order */
  int n_devices;
  bh_status_device devices[BH_STATUS_DEVICES_MAX];
  int gpu_available;            /* NVML opened */
  char gpu_error[256];          /* why not ("" when it did) */
  char ram_error[256];          /* "" unless the RAM probe failed */
} bh_status_snap;

/* The GPU probe, opened once per run ($BULKHEAD_NVML_LIBRARY if set and
 * not empty, else dlopen's search) and kept by `top` across refreshes.
 * A caller that already holds an open bh_gpu (the extension: a host's
 * _native.Gpu) sets .gpu in a zeroed struct instead of calling
 * bh_status_probes_open, and never calls bh_status_probes_close on it:
 * the handle stays the caller's. */
typedef struct bh_status_probes {
  bh_gpu *gpu;        /* owned (after _open), NULL when NVML is unavailable */
  char gpu_error[256];
} bh_status_probes;

void bh_status_probes_open(bh_status_probes *p);
void bh_status_probes_close(bh_status_probes *p);

/* Takes a snapshot.  ledger: an open handle to read through (borrowed;
 * not joined by this call, not closed), and then ledger_path is ignored;
 * NULL: the file at ledger_path is opened for the snapshot and closed
 * again (ledger_path NULL: the default path), and a ledger file that does
 * not exist is not created (ledger_present 0, no records).
 * p NULL: no probes at all (no devices).
 * Returns 0 (the probes' failures are recorded in the snap, never fatal)
 * or a negative code from the ledger (the message is the caller's to
 * print, with bh_strerror).  *s is the caller's: bh_status_snap_free, also
 * after a failure. */
int bh_status_snap_take(bh_status_snap *s, const char *ledger_path, bh_ledger *ledger,
                        const bh_status_probes *p);
void bh_status_snap_free(bh_status_snap *s);

/* Bytes a record holds over all its devices. */
uint64_t bh_status_record_held(const bh_ledger_record *r);

/* Display order: hosts, each followed by its workers (records whose
 * host_pid is that host), then records with no live host.  by_held 0:
 * by pid; 1: groups by their total held bytes, then workers by held bytes,
 * largest first.  Fills idx[] and depth[] (0 or 1; room for n_records
 * each) and returns the count. */
int bh_status_snap_order(const bh_status_snap *s, int by_held, int *idx, int *depth);

/* Role and run-state words ("host", "busy", "unknown"). */
const char *bh_status_role_name(int role);
const char *bh_status_run_name(int run);

/* The JSON document (schema in status.c's header and the README), one
 * line, newline-terminated. */
int bh_status_json(bh_buf *b, const bh_status_snap *s);
/* The table for people, every line at most `cols` characters wide. */
int bh_status_text(bh_buf *b, const bh_status_snap *s, unsigned cols);

/* Appends "<label>     <text>" (the label padded to 10) as lines of at
 * most cols, the text wrapped at spaces onto lines indented under it (a
 * word longer than a whole line, a long path, is broken across lines): a
 * reason is shown whole.  text is printed as it is: a caller passes text
 * that bh_text_fit has made safe for a terminal. */
void bh_status_wrapped(bh_buf *b, const char *label, const char *text, unsigned cols);

#endif /* BULKHEAD_STATUS_H */
