/*
 * canary.h -- `bulkhead canary COMFYUI_DIR`: derive, from upstream's
 * comfy/model_management.py, the members ComfyUI's memory manager reads
 * off a ledger entry's patcher, and check bulkhead's StandIn against them.
 *
 * ComfyUI declares no interface for what sits in current_loaded_models;
 * the StandIn answers the 18 members of COMFY_SURFACE (seed 000).  The
 * canary reads the one file that reads them, with a small Python tokenizer
 * and a flow-insensitive pass over its statements (tools/canary.c explains
 * the heuristics), and sorts every name it finds into: answered by the
 * StandIn, lacking, gated behind is_dynamic() (the StandIn answers False,
 * so those reads never reach it), not members (the inner module, dunders),
 * probed (hasattr / getattr with a default: a miss is not an error), and
 * the call shapes the StandIn would refuse (a keyword or an extra
 * positional it does not take, a call of an attribute, a write).
 *
 * The library is not involved: this is a tool.  bh_canary_main is what
 * `bulkhead canary` runs; the rest is exposed for the unit tests.
 *
 * Ownership: a report from bh_canary_analyze and a token array from
 * bh_canary_tokenize are the caller's, released with
 * bh_canary_report_free / free().  Nothing here keeps global state; all of
 * it is thread-compatible.
 */
#ifndef BULKHEAD_TOOLS_CANARY_H
#define BULKHEAD_TOOLS_CANARY_H

#include "bulkhead/bulkhead.h"

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The largest source the canary reads (upstream's file is ~70 KiB). */
#define BH_CANARY_MAX_SOURCE (4u << 20)

/* ------------------------------------------------------------ tokenizer */

enum bh_canary_tok_kind {
  BH_TOK_NAME,    /* identifier or keyword */
  BH_TOK_NUMBER,
  BH_TOK_STRING,  /* a whole literal, prefix and quotes included */
  BH_TOK_OP,      /* operator or punctuation, or one byte nothing else takes */
  BH_TOK_NEWLINE, /* end of a logical line (never inside brackets) */
  BH_TOK_FOPEN,   /* '{' opening an f-string replacement field ... */
  BH_TOK_FCLOSE,  /* ... and its end ('}', or empty when unterminated) */
  BH_TOK_END
};

/* A token: bytes [off, off + len) of the source.  The tokens of an
 * f-string's replacement fields follow its STRING token, each field
 * bracketed by FOPEN/FCLOSE.  `line` is 1-based (a multi-line token: where
 * it starts); `indent` is the column (tabs to multiples of 8) for the first
 * token of a logical line, -1 on every other token. */
typedef struct {
  uint8_t kind;
  int32_t line;
  int32_t indent;
  uint32_t off;
  uint32_t len;
} bh_canary_token;

/* Tokenizes src[0, len) (NUL bytes and invalid UTF-8 are fine: it is total
 * on any input).  On success *out is a malloc'ed array ending in one
 * BH_TOK_END token, owned by the caller (free()), and *n its length.
 * Returns 0, -EINVAL (NULL arguments), -EFBIG (len > BH_CANARY_MAX_SOURCE)
 * or -ENOMEM; on failure *out is NULL. */
BH_EXTERN int bh_canary_tokenize(const char *src, size_t len, bh_canary_token **out, size_t *n);

/* -------------------------------------------------------------- report */

/* How a name was used (bits). */
enum {
  BH_CANARY_READ = 1,  /* read as a value: x.name */
  BH_CANARY_CALL = 2,  /* called: x.name(...) */
  BH_CANARY_WRITE = 4, /* assigned: x.name = ... */
  BH_CANARY_PROBE = 8  /* hasattr(x, "name") or getattr(x, "name", default) */
};

enum bh_canary_class {
  BH_CANARY_ANSWERED,   /* upstream reads it, the StandIn answers it */
  BH_CANARY_LACKING,    /* upstream reads it, the StandIn does not answer it */
  BH_CANARY_GATED,      /* only read where is_dynamic() is True */
  BH_CANARY_NOT_MEMBER, /* the inner module (.model.model), dunders */
  BH_CANARY_PROBED      /* only probed: a miss is no error */
};

/* One distinct call shape: how many plain positional arguments, whether
 * *args / **kwargs are passed, and the keyword names in call order
 * ("a,b"; "" for none). */
typedef struct {
  int line;
  int positional;
  int star, kwstar;
  char *keywords;
} bh_canary_shape;

typedef struct {
  char *name;
  enum bh_canary_class cls;
  int in_surface;        /* the StandIn (minus --without) answers it */
  unsigned uses;         /* BH_CANARY_* bits of the ungated uses */
  unsigned gated_uses;   /* ... and of the uses behind is_dynamic() */
  int line;              /* first ungated use; 0 when there is none */
  int gated_line;        /* first gated use; 0 when there is none */
  const char *why;       /* BH_CANARY_NOT_MEMBER: what it is (static) */
  bh_canary_shape *shapes; /* distinct ungated call shapes, first-use order */
  size_t nshapes;
} bh_canary_name;

/* A call shape (or use) the StandIn would refuse. */
typedef struct {
  char *name;
  int line;
  char *shape;  /* the use as upstream writes it, e.g. "detach(unpatch_all=..., keep=...)" */
  char *reason; /* why the StandIn refuses it */
} bh_canary_change;

typedef struct {
  bh_canary_name *names; /* every name read off a patcher, first-use order */
  size_t nnames;
  bh_canary_change *changes;
  size_t nchanges;
  const char *unread[32]; /* surface members upstream never reads ungated (static) */
  size_t nunread;
  const char *without[32]; /* surface members left out for this check (static) */
  size_t nwithout;
  size_t nanswered, nlacking, ngated, nnot_members, nprobed;
} bh_canary_report;

/* Derives the interface src[0, len) (a model_management.py) demands of a
 * ledger entry's patcher and checks it against the StandIn's baseline.
 * `without` is NULL or a NULL-terminated list of surface member names to
 * leave out of the StandIn for this check (what would fail without them).
 * On success *out is a report owned by the caller (bh_canary_report_free).
 * Returns 0, -EINVAL (NULL arguments, or a `without` name the StandIn does
 * not have), -EFBIG or -ENOMEM. */
BH_EXTERN int bh_canary_analyze(const char *src, size_t len, const char *const *without,
                                bh_canary_report **out);

/* The entry for `name`, or NULL.  Borrowed from the report. */
BH_EXTERN const bh_canary_name *bh_canary_report_find(const bh_canary_report *r, const char *name);

/* 0 when the StandIn covers every member upstream reads and every call
 * shape, 1 otherwise. */
BH_EXTERN int bh_canary_report_status(const bh_canary_report *r);

/* Writes the report for `path` (named on every line) to f: sections for
 * humans, or one JSON object when json is set.  Returns 0 or -EIO. */
BH_EXTERN int bh_canary_report_write(const bh_canary_report *r, const char *path, int json, FILE *f);

/* Releases a report (NULL is fine). */
BH_EXTERN void bh_canary_report_free(bh_canary_report *r);

/* `bulkhead canary [--json] [--without NAME]... COMFYUI_DIR`; argv[0] is
 * "canary".  COMFYUI_DIR is a ComfyUI checkout (its
 * comfy/model_management.py is read) or that file itself.  Writes the
 * report to stdout, errors to stderr.  Returns the exit status: 0 the
 * StandIn covers everything, 1 it does not (the list says what), 2 the
 * file cannot be read (path and errno named) or a usage error. */
BH_EXTERN int bh_canary_main(int argc, char **argv);

#ifdef __cplusplus
}
#endif

#endif
