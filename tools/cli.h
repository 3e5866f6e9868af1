/*
 * cli.h -- the `bulkhead` command's own declarations, shared by its files:
 *
 *   bulkhead.c   main: the verbs, usage and --help texts, exit codes
 *   status.c     a snapshot of the machine (ledger + probes) and its two
 *                renderings: the human table and the JSON document
 *   top.c        the live screen (alternate screen, raw keys, signals)
 *   release.c    `release`: the ledger to find a worker's host, the host's
 *                control socket to ask it
 *   text.c       pure helpers: byte sizes parsed and printed, durations,
 *                JSON strings, text clipped and cleaned for a terminal
 *
 * None of this is library API (nothing is BH_EXTERN: it is linked into the
 * program, and text.c also into the C tests).  Functions follow the house
 * conventions all the same: int returns >= 0 / -errno, text appended to a
 * caller's bh_buf (the codec's growable buffer: its first allocation
 * failure is sticky in b->err, so a caller checks once at the end).
 */
#ifndef BULKHEAD_TOOLS_CLI_H
#define BULKHEAD_TOOLS_CLI_H

#include "bulkhead/bulkhead.h"
#include "bulkhead/ledger.h"
#include "bulkhead/probe.h"

#include <limits.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* Exit codes a script can rely on (also in every --help text). */
enum {
  BH_CLI_EXIT_OK = 0,
  BH_CLI_EXIT_NOTFOUND = 1,    /* no such worker (or a pack names several) */
  BH_CLI_EXIT_USAGE = 2,       /* bad verb, option or value */
  BH_CLI_EXIT_UNREACHABLE = 3, /* the host's control socket is missing, refuses, or never answers */
  BH_CLI_EXIT_REFUSED = 4,     /* the host answered with an error */
  BH_CLI_EXIT_LEDGER = 5,      /* the ledger exists but cannot be read */
};

/* The version of the JSON document `status --json` prints.  Bumped only
 * when a field changes meaning or goes away; new fields do not bump it. */
#define BH_CLI_JSON_SCHEMA 1

/* ------------------------------------------------------------ text.c */

/* Parses a byte count: digits, optionally a fraction, optionally a suffix
 * (case-insensitive, blanks allowed before it): B; K, M, G, T, P and KiB,
 * MiB, GiB, TiB, PiB (powers of 1024); KB, MB, GB, TB, PB (powers of 1000).
 * "1.5G" is 1610612736; a fraction is truncated to whole bytes.  Returns
 * 0, -EINVAL (empty, malformed, a sign, an unknown suffix, a fraction
 * without a suffix), -ERANGE (more than UINT64_MAX). */
int bh_cli_bytes_parse(const char *s, uint64_t *out);

/* Formats n for people: "0 B", "1023 B", "1.0 KiB", "512.0 MiB",
 * "1023.9 GiB", up to EiB (at most 10 characters).  Returns the length
 * written into buf (NUL-terminated; truncated to len - 1). */
int bh_cli_bytes_format(uint64_t n, char *buf, size_t len);

/* Parses seconds (a decimal number, e.g. "0.5") within [lo, hi].  Returns
 * 0 or -EINVAL. */
int bh_cli_seconds_parse(const char *s, double lo, double hi, double *out);

/* Formats an idle time: "0s", "59s", "5m03s", "2h05m", "3d04h"; a negative
 * value (unknown) gives "-".  Returns the length written. */
int bh_cli_idle_format(int64_t ns, char *buf, size_t len);

/* Appends printf-style text.  Returns 0 or the buffer's sticky error. */
int bh_cli_appendf(bh_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Appends a JSON string literal (quotes included) for the n bytes at s:
 * '"' and '\\' escaped, control characters (< 0x20, and 0x7f) as \n, \t,
 * ... or \u00XX, every byte that is not part of valid UTF-8 (overlongs,
 * surrogates, beyond U+10FFFF, truncated sequences) as \ufffd; valid
 * UTF-8 passes through.  The output is always valid JSON. */
int bh_cli_json_str(bh_buf *b, const char *s, size_t n);

/* Copies the NUL-terminated src into dst for a terminal: at most `cols`
 * characters (code points), control characters and invalid UTF-8 replaced
 * by '?' (a pack name must never move the cursor), and when src is longer
 * its last character shown is '~'.  With pad, pads with blanks to exactly
 * cols characters.  dst gets at most 4 * cols + 1 bytes (dstlen must allow
 * that or the text is cut sooner).  Returns the characters written. */
int bh_cli_text_fit(char *dst, size_t dstlen, const char *src, unsigned cols, int pad);

/* Cuts the line (no newline in it) that starts at b->data + start so that
 * it spans at most `cols` characters; escape sequences (ESC [ ... final
 * byte) count as none.  Returns the characters left. */
unsigned bh_cli_line_clip(bh_buf *b, size_t start, unsigned cols);

/* Writes a bar of exactly `width` characters: '|' for part/whole of it
 * (rounded to nearest, at least one when part > 0), '.' for the rest.
 * whole == 0 gives all '.'.  dst gets width + 1 bytes. */
void bh_cli_bar(char *dst, uint64_t part, uint64_t whole, unsigned width);

/* What a host's control socket answered to `release` (its RESULT or ERROR
 * map); absent fields stay as the caller set them. */
typedef struct bh_cli_answer {
  int64_t worker_pid, before_bytes, after_bytes, freed_bytes;
  char pack[BH_LEDGER_PACK_MAX];
  char type[128], message[2048];
} bh_cli_answer;

/* Reads an encoded answer (any value the peer sent) into *a: the whole
 * value is validated first, then a map's known keys are taken (ints and
 * strings; strings clipped to their fields, always NUL-terminated), every
 * other key and value skipped.  Returns 0, -BH_EBADTAG when the value is
 * not a map, or the decoder's BH_E* code.  Total: any bytes are safe. */
int bh_cli_answer_read(const uint8_t *p, size_t n, bh_cli_answer *a);

/* ---------------------------------------------------------- status.c */

/* One device's capacity as the probes read it now. */
typedef struct bh_cli_device {
  char device[BH_LEDGER_DEVICE_MAX]; /* "cpu", "cuda:<nvml index>" */
  uint64_t total_bytes, free_bytes;
  const char *source;                /* "meminfo", "cgroup", "nvml" (static) */
  int index;                         /* NVML index, -1 for cpu */
  char uuid[BH_GPU_UUID_MAX];        /* "" for cpu */
  char name[BH_GPU_NAME_MAX];        /* "NVIDIA H200"; "" for cpu */
} bh_cli_device;

#define BH_CLI_DEVICES_MAX 33 /* cpu + 32 GPUs */

/* Everything `status` and `top` show, taken at one moment. */
typedef struct bh_cli_snap {
  char ledger_path[PATH_MAX];
  int ledger_present;           /* 0: no ledger file (nobody ever joined) */
  int64_t now_ns;               /* CLOCK_MONOTONIC when taken */
  int n_records;
  bh_ledger_record *records;    /* owned; slot order */
  int n_devices;
  bh_cli_device devices[BH_CLI_DEVICES_MAX];
  int gpu_available;            /* NVML opened */
  char gpu_error[256];          /* why not ("" when it did) */
  char ram_error[256];          /* "" unless the RAM probe failed */
} bh_cli_snap;

/* The GPU probe, opened once per run ($BULKHEAD_NVML_LIBRARY if set and
 * not empty, else dlopen's search) and kept by `top` across refreshes. */
typedef struct bh_cli_probes {
  bh_gpu *gpu;        /* owned, NULL when NVML is unavailable */
  char gpu_error[256];
} bh_cli_probes;

void bh_cli_probes_open(bh_cli_probes *p);
void bh_cli_probes_close(bh_cli_probes *p);

/* Takes a snapshot.  ledger_path NULL: the default path.  A ledger file
 * that does not exist is not created (ledger_present 0, no records).
 * p NULL: no probes at all (no devices).
 * Returns 0 (the probes' failures are recorded in the snap, never fatal)
 * or a negative code from the ledger (the message is the caller's to
 * print, with bh_strerror).  *s is the caller's: bh_cli_snap_free, also
 * after a failure. */
int bh_cli_snap_take(bh_cli_snap *s, const char *ledger_path, const bh_cli_probes *p);
void bh_cli_snap_free(bh_cli_snap *s);

/* Bytes a record holds over all its devices. */
uint64_t bh_cli_record_held(const bh_ledger_record *r);

/* Display order: hosts, each followed by its workers (records whose
 * host_pid is that host), then records with no live host.  by_held 0:
 * by pid; 1: groups by their total held bytes, then workers by held bytes,
 * largest first.  Fills idx[] and depth[] (0 or 1; room for n_records
 * each) and returns the count. */
int bh_cli_snap_order(const bh_cli_snap *s, int by_held, int *idx, int *depth);

/* Role and run-state words ("host", "busy", "unknown"). */
const char *bh_cli_role_name(int role);
const char *bh_cli_run_name(int run);

/* The JSON document (schema in status.c's header and the README), one
 * line, newline-terminated. */
int bh_cli_status_json(bh_buf *b, const bh_cli_snap *s);
/* The table for people, every line at most `cols` characters wide. */
int bh_cli_status_text(bh_buf *b, const bh_cli_snap *s, unsigned cols);

/* Writes all of b to fd (retrying short writes and EINTR).  0 or -errno. */
int bh_cli_write_all(int fd, const void *p, size_t n);

/* ------------------------------------------------------------- verbs */

int bh_cli_status_main(int argc, char **argv);
int bh_cli_top_main(int argc, char **argv);
int bh_cli_release_main(int argc, char **argv);

/* Usage texts (bulkhead.c): print `verb`'s help ("" for the command's
 * own) to f and return code. */
int bh_cli_usage(FILE *f, const char *verb, int code);

/* For option errors: "bulkhead VERB: unknown option '--x'" and the verb's
 * usage on stderr; returns BH_CLI_EXIT_USAGE. */
int bh_cli_usage_error(const char *verb, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif /* BULKHEAD_TOOLS_CLI_H */
