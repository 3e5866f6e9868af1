/*
 * cli.h -- the `bulkhead` command's own declarations, shared by its files:
 *
 *   bulkhead.c   main: the verbs, usage and --help texts, exit codes
 *   status_main.c  `status`: a snapshot (the status library, src/status/)
 *                printed as the table or the JSON document
 *   top.c        the live screen (alternate screen, raw keys, signals)
 *   release.c    `release`: the ledger to find a worker's host, the host's
 *                control socket to ask it
 *   text.c       pure helpers: byte sizes and seconds parsed, bars, the
 *                control socket's answer read
 *
 * None of this is library API (nothing is BH_EXTERN: it is linked into the
 * program, and text.c also into the C tests).  Functions follow the house
 * conventions all the same: int returns >= 0 / -errno, text appended to a
 * caller's bh_buf (the codec's growable buffer: its first allocation
 * failure is sticky in b->err, so a caller checks once at the end).
 */
#ifndef BULKHEAD_TOOLS_CLI_H
#define BULKHEAD_TOOLS_CLI_H

#include "src/status/status.h" /* the status snapshot, its renderings, the text helpers */

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

/* ------------------------------------------------------------ text.c */

/* Parses a byte count: digits, optionally a fraction, optionally a suffix
 * (case-insensitive, blanks allowed before it): B; K, M, G, T, P and KiB,
 * MiB, GiB, TiB, PiB (powers of 1024); KB, MB, GB, TB, PB (powers of 1000).
 * "1.5G" is 1610612736; a fraction is truncated to whole bytes.  Returns
 * 0, -EINVAL (empty, malformed, a sign, an unknown suffix, a fraction
 * without a suffix), -ERANGE (more than UINT64_MAX). */
int bh_cli_bytes_parse(const char *s, uint64_t *out);

/* Parses seconds (a decimal number, e.g. "0.5") within [lo, hi].  Returns
 * 0 or -EINVAL. */
int bh_cli_seconds_parse(const char *s, double lo, double hi, double *out);

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

/* One row of a host's `packs` answer (control.py: where each pack it
 * serves stands); strings clipped, NUL-terminated; pid -1 when absent. */
typedef struct bh_cli_pack {
  char name[128], state[16], reason[512], fix[256];
  char sandbox[160]; /* "sandboxed", or "not sandboxed (why)" (host/sandbox.py), or "" */
  char log[1024];    /* its newest build's log file, or "" (host/building.py annotate) */
  char actions[64];  /* what the panel offers: "retry", "retry, rebuild", or "" */
  char command[1024]; /* the same from a terminal: "bulkhead install <pack>", or "" */
  int64_t pid;
} bh_cli_pack;

/* The string members of a bh_cli_pack: each one's key (the same in a
 * host's `packs` answer and in `bulkhead status --json`), where it lies
 * and its size, in the order the JSON lists them.  bh_cli_packs_read
 * fills a row by this table and status_main.c writes one by it, so a
 * member added here is read and written both. */
typedef struct bh_cli_pack_str {
  const char *key;
  size_t offset, size;
} bh_cli_pack_str;

#define BH_CLI_PACK_STRS 8
extern const bh_cli_pack_str bh_cli_pack_strs[BH_CLI_PACK_STRS];

/* Reads a host's `packs` answer (a list of maps) into rows[0..max), the
 * rows past max and any item that is not a map skipped; *count the rows
 * read.  Returns 0, -BH_EBADTAG when the value is not a list, or the
 * decoder's BH_E* code.  Total: any bytes are safe. */
int bh_cli_packs_read(const uint8_t *p, size_t n, bh_cli_pack *rows, int max, int *count);

/* Calls `target` with `args` (one encoded tuple, borrowed) on host's
 * control socket (release.c: every place it may be), waiting at most
 * timeout_s, and hands the answer to read(value, len, is_error, ctx).
 * Messages start "bulkhead <verb>: " and go to stderr, none when quiet.
 * Returns BH_CLI_EXIT_OK (answered), _REFUSED (the host answered an
 * error), _UNREACHABLE (no socket, refused, no answer in time, or an
 * answer read refused). */
int bh_cli_host_call(const char *verb, pid_t host, const char *target, const bh_buf *args, double timeout_s,
                     int quiet, int (*read)(const uint8_t *p, size_t n, int is_error, void *ctx), void *ctx);

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
