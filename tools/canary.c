/*
 * canary.c -- `bulkhead canary COMFYUI_DIR`: the drift canary (seed 000,
 * "How we know it still fits").  Reads upstream's
 * comfy/model_management.py, derives what its memory manager reads off a
 * ledger entry's patcher, and checks that against what bulkhead's StandIn
 * answers (BASELINE below, which mirrors src/python/standin.c).
 *
 * Layout.  Three passes over one buffer, no global state:
 *
 *  1. The tokenizer (lx_*) turns the source into bh_canary_token: names,
 *     numbers, whole string literals (prefixes, triple quotes, escapes),
 *     operators, and NEWLINE at the end of each logical line.  Comments,
 *     blank lines and backslash continuations produce nothing; inside
 *     brackets newlines do not end the line.  The first token of a logical
 *     line carries its indentation column.  An f-string's replacement
 *     fields are tokenized too (FOPEN ... FCLOSE after the STRING token),
 *     with PEP 701 nesting, so `f"{entry.model.model.__class__}"`, which
 *     upstream evaluates eagerly in a log call, is seen.  It is total: any
 *     byte sequence tokenizes (an unknown byte is a one-byte OP, an
 *     unterminated string ends at the end of its line or of the input),
 *     f-string nesting is capped at MAX_NEST, and no read goes past len.
 *
 *  2. The statement walker (process_line, header, simple) splits logical
 *     lines at `;` and at the colon of a compound header with an inline
 *     body (the body gets the header's indentation + 1), and keeps a stack
 *     of frames by indentation: module, class, def, if/elif branch, other
 *     blocks.  Each frame knows whether everything in it is reached only
 *     when is_dynamic() is True ("gated").
 *
 *  3. Per statement: bracket matching, gating of sub-expressions,
 *     comprehension variables, then a scan of every access chain
 *     (NAME followed by .attr, (call) and [subscript] trailers), which
 *     evaluates a "kind" along the chain and records each member read off
 *     a patcher; finally the statement's bindings (assignments, for
 *     targets, `as`) update the function's aliases.
 *
 * What is a patcher (the kinds).  ENTRY is a LoadedModel (a ledger entry),
 * PATCHER what its .model returns, INNER the patcher's own .model (the
 * torch module), ENTRIES / PATCHERS collections of them.  Sources:
 *   - current_loaded_models is ENTRIES; subscripts, .pop() of it are ENTRY,
 *     .copy(), slices, sorted()/reversed()/list()/... of it are ENTRIES,
 *     enumerate() of it gives (index, ENTRY);
 *   - LoadedModel(...) is an ENTRY; in a method of class LoadedModel the
 *     first parameter (self) is an ENTRY and a parameter named `model`
 *     (and __init__'s first argument) a PATCHER;
 *   - ENTRY.model is a PATCHER; and, as the seed's grep did, `<x>.model`
 *     on anything not known to be a patcher or a list is taken to be a
 *     ledger entry's, so `.model.<name>` counts wherever it appears;
 *   - load_models_gpu's first parameter is PATCHERS (the incoming models),
 *     unload_model_and_clones's first parameter a PATCHER; a patcher's
 *     model_patches_models() / get_nested_additional_models() are PATCHERS;
 *   - a name bound to one of these (`model = x.model`, `for x in models`,
 *     comprehension variables, `lst.append(entry)` making lst a list of
 *     them) keeps the kind in its function until rebound: an alias lives in
 *     one function body, found by indentation.  Order is textual; values
 *     returned from other functions are not followed.
 * Every `.name` read off a PATCHER is recorded: read, call (with its
 * positional count, *args or **kwargs, keyword names), or write.
 * hasattr(p, "name") and getattr(p, "name", default) are probes (a miss is
 * no error); getattr(p, "name") is a read.
 *
 * The is_dynamic() heuristic.  A condition "implies dynamic" when it being
 * True (or False) guarantees some `<chain>.is_dynamic()` returned True,
 * worked out over and / or / not and parentheses (any other comparison or
 * call is opaque).  Then a use is gated when it sits
 *   - in the body of `if C:` / `while C:` where C implies dynamic, or in
 *     an elif/else branch reached only when an earlier condition being
 *     False implies dynamic (`if not p.is_dynamic(): ... else: <gated>`);
 *   - after `if C: return|continue|break|raise` in the same block when C
 *     being False implies dynamic (`if p is None or not p.is_dynamic():
 *     continue`), provided every earlier branch of that if chain exits too;
 *   - in `A if C else B` (A when C implies dynamic, B when not-C does), in
 *     the element or later clauses of a comprehension after `if C`, and in
 *     the right operand of `and` / `or` whose left side implies dynamic
 *     when True / False.
 * It does not check that is_dynamic() was asked of the same object, and
 * an exiting `else:` branch gates nothing.  The StandIn answers
 * is_dynamic() False, so gated reads never reach it: they are reported but
 * do not fail the check.
 *
 * Not members.  `.model.model` is the patcher's inner module (reported as
 * such; the StandIn answers `.model` with a RemoteModel), reads off the
 * inner module are not the patcher's, and dunders (__class__, ...) every
 * object has.
 *
 * Locking: none; a report is plain data owned by the caller.
 */
#include "canary.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define MAX_NEST 16    /* f-strings nested in replacement fields */
#define MAX_DEPTH 64   /* expression nesting the gating and kind passes follow */
#define MAX_COMPS 256  /* comprehension variables per statement */
#define MAX_SHAPES 64  /* distinct call shapes kept per name */
#define MAX_COLUMN (1 << 24)
#define NONE ((size_t)-1)

/* ------------------------------------------------------------ baseline */

/* What the StandIn answers (src/python/standin.c) and how: an attribute,
 * or a method with these parameters.  A call with a keyword it does not
 * take, more positionals than it has parameters, or without a required
 * argument is a changed call shape. */
enum { P_REQUIRED = 1, P_POSONLY = 2 };

typedef struct {
  const char *name;
  int flags;
} param_t;

typedef struct {
  const char *name;
  int is_call;
  const char *signature;
  int nparams;
  param_t params[3];
} baseline_t;

static const baseline_t BASELINE[] = {
    {"load_device", 0, "load_device (an attribute)", 0, {{0}}},
    {"offload_device", 0, "offload_device (an attribute)", 0, {{0}}},
    {"parent", 0, "parent (an attribute, always None)", 0, {{0}}},
    {"model", 0, "model (an attribute: the RemoteModel)", 0, {{0}}},
    {"model_size", 1, "model_size()", 0, {{0}}},
    {"loaded_size", 1, "loaded_size()", 0, {{0}}},
    {"current_loaded_device", 1, "current_loaded_device()", 0, {{0}}},
    {"model_dtype", 1, "model_dtype()", 0, {{0}}},
    {"model_patches_to", 1, "model_patches_to(device)", 1, {{"device", P_REQUIRED}}},
    {"model_patches_models", 1, "model_patches_models()", 0, {{0}}},
    {"partially_load", 1, "partially_load(device_to, extra_memory=0, force_patch_weights=False)", 3,
     {{"device_to", P_REQUIRED}, {"extra_memory", 0}, {"force_patch_weights", 0}}},
    {"partially_unload", 1,
     "partially_unload(device_to, memory_to_free=0, force_patch_weights=False)", 3,
     {{"device_to", P_REQUIRED}, {"memory_to_free", 0}, {"force_patch_weights", 0}}},
    {"detach", 1, "detach(unpatch_all=True)", 1, {{"unpatch_all", 0}}},
    {"lowvram_patch_counter", 1, "lowvram_patch_counter()", 0, {{0}}},
    {"is_dynamic", 1, "is_dynamic()", 0, {{0}}},
    {"is_clone", 1, "is_clone(other, /)", 1, {{"other", P_REQUIRED | P_POSONLY}}},
    {"clone_base_uuid", 0, "clone_base_uuid (an attribute)", 0, {{0}}},
    {"get_nested_additional_models", 1, "get_nested_additional_models()", 0, {{0}}},
};
#define NBASELINE (sizeof BASELINE / sizeof BASELINE[0])

static const baseline_t *baseline_find(const char *name) {
  for (size_t i = 0; i < NBASELINE; i++)
    if (strcmp(BASELINE[i].name, name) == 0) return &BASELINE[i];
  return NULL;
}

/* ----------------------------------------------------------- tokenizer */

typedef struct {
  const char *s;
  size_t n, p;
  int32_t line;
  bh_canary_token *t;
  size_t nt, cap;
  int depth;      /* open brackets outside f-string fields */
  int has_tokens; /* the current logical line has a token */
  int32_t indent; /* column of the current logical line */
  int err;
} lexer;

enum { F_DONE, F_QUOTE, F_CLOSE, F_END };

static int name_start(unsigned char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c >= 0x80;
}
static int name_char(unsigned char c) { return name_start(c) || (c >= '0' && c <= '9'); }
static int digit(unsigned char c) { return c >= '0' && c <= '9'; }

/* Length of the newline at p (\n, \r\n or \r), 0 if none. */
static size_t lx_nl(const lexer *lx, size_t p) {
  if (p >= lx->n) return 0;
  if (lx->s[p] == '\n') return 1;
  if (lx->s[p] == '\r') return (p + 1 < lx->n && lx->s[p + 1] == '\n') ? 2 : 1;
  return 0;
}

/* Appends a token; returns its index, or NONE once out of memory. */
static size_t lx_emit(lexer *lx, int kind, size_t off, size_t len) {
  if (lx->err) return NONE;
  if (lx->nt == lx->cap) {
    size_t cap = lx->cap ? lx->cap * 2 : 1024;
    bh_canary_token *t = realloc(lx->t, cap * sizeof *t);
    if (!t) {
      lx->err = -ENOMEM;
      return NONE;
    }
    lx->t = t, lx->cap = cap;
  }
  bh_canary_token *k = &lx->t[lx->nt];
  k->kind = (uint8_t)kind;
  k->line = lx->line;
  k->off = (uint32_t)off;
  k->len = (uint32_t)len;
  k->indent = -1;
  if (kind != BH_TOK_NEWLINE && kind != BH_TOK_END && !lx->has_tokens) {
    k->indent = lx->indent;
    lx->has_tokens = 1;
  }
  return lx->nt++;
}

/* At a backslash: skips it and what it escapes (a newline counts). */
static void lx_escape(lexer *lx) {
  lx->p++;
  size_t nl = lx_nl(lx, lx->p);
  if (nl) {
    lx->p += nl;
    lx->line++;
  } else if (lx->p < lx->n) {
    lx->p++;
  }
}

/* At the quote character q: is this the string's end? */
static int lx_closes(const lexer *lx, char q, int triple) {
  if (lx->s[lx->p] != q) return 0;
  if (!triple) return 1;
  return lx->p + 2 < lx->n && lx->s[lx->p + 1] == q && lx->s[lx->p + 2] == q;
}

/* The body of a string without fields, after its opening quote(s). */
static void lx_plain_body(lexer *lx, char q, int triple) {
  while (lx->p < lx->n) {
    if (lx->s[lx->p] == '\\') {
      lx_escape(lx);
      continue;
    }
    size_t nl = lx_nl(lx, lx->p);
    if (nl) {
      if (!triple) return; /* unterminated: ends with its line */
      lx->p += nl;
      lx->line++;
      continue;
    }
    if (lx_closes(lx, q, triple)) {
      lx->p += triple ? 3 : 1;
      return;
    }
    lx->p++;
  }
}

static int lx_fbody(lexer *lx, char q, int triple, int nest, int in_spec);
static void lx_token(lexer *lx, int nest, int in_field);

/* A replacement field, at its '{'.  Always emits FOPEN ... FCLOSE. */
static int lx_field(lexer *lx, char q, int triple, int nest) {
  lx_emit(lx, BH_TOK_FOPEN, lx->p, 1);
  lx->p++;
  int fdepth = 0, r = F_END;
  while (lx->p < lx->n && !lx->err) {
    unsigned char c = (unsigned char)lx->s[lx->p];
    if (c == ' ' || c == '\t' || c == '\f') {
      lx->p++;
      continue;
    }
    size_t nl = lx_nl(lx, lx->p);
    if (nl) {
      if (!triple && fdepth == 0) break; /* the string is unterminated */
      lx->p += nl;
      lx->line++;
      continue;
    }
    if (c == '\\') {
      size_t nl2 = lx_nl(lx, lx->p + 1);
      if (nl2) {
        lx->p += 1 + nl2;
        lx->line++;
        continue;
      }
      lx_emit(lx, BH_TOK_OP, lx->p, 1);
      lx->p++;
      continue;
    }
    if (fdepth == 0) {
      if (c == '}') {
        lx_emit(lx, BH_TOK_FCLOSE, lx->p, 1);
        lx->p++;
        return F_DONE;
      }
      if (c == ':') { /* format spec: more string body, with fields */
        lx->p++;
        r = lx_fbody(lx, q, triple, nest + 1, 1);
        if (r == F_CLOSE) {
          lx_emit(lx, BH_TOK_FCLOSE, lx->p, 1);
          lx->p++;
          return F_DONE;
        }
        break;
      }
      if (c == '!' && !(lx->p + 1 < lx->n && lx->s[lx->p + 1] == '=')) { /* conversion */
        lx->p++;
        while (lx->p < lx->n && name_char((unsigned char)lx->s[lx->p])) lx->p++;
        continue;
      }
    }
    if (c == '(' || c == '[' || c == '{') {
      fdepth++;
      lx_emit(lx, BH_TOK_OP, lx->p, 1);
      lx->p++;
      continue;
    }
    if (c == ')' || c == ']' || c == '}') {
      if (fdepth > 0) fdepth--;
      lx_emit(lx, BH_TOK_OP, lx->p, 1);
      lx->p++;
      continue;
    }
    if (c == '#') { /* no comments inside a field */
      lx_emit(lx, BH_TOK_OP, lx->p, 1);
      lx->p++;
      continue;
    }
    lx_token(lx, nest, 1);
  }
  lx_emit(lx, BH_TOK_FCLOSE, lx->p, 0);
  return r;
}

/* The body of an f-string (or of a format spec, in_spec), after its
 * opening quote(s). */
static int lx_fbody(lexer *lx, char q, int triple, int nest, int in_spec) {
  while (lx->p < lx->n && !lx->err) {
    char c = lx->s[lx->p];
    if (c == '\\') {
      lx_escape(lx);
      continue;
    }
    size_t nl = lx_nl(lx, lx->p);
    if (nl) {
      if (!triple) return F_END;
      lx->p += nl;
      lx->line++;
      continue;
    }
    if (lx_closes(lx, q, triple)) {
      if (in_spec) return F_QUOTE;
      lx->p += triple ? 3 : 1;
      return F_DONE;
    }
    if (c == '{') {
      if (!in_spec && lx->p + 1 < lx->n && lx->s[lx->p + 1] == '{') {
        lx->p += 2;
        continue;
      }
      if (nest > MAX_NEST) { /* too deep: plain text from here */
        lx->p++;
        continue;
      }
      if (lx_field(lx, q, triple, nest) == F_END) return F_END;
      continue;
    }
    if (c == '}') {
      if (in_spec) return F_CLOSE;
      lx->p += (lx->p + 1 < lx->n && lx->s[lx->p + 1] == '}') ? 2 : 1;
      continue;
    }
    lx->p++;
  }
  return F_END;
}

/* A string literal from `start` (its prefix) with the quote at qpos. */
static void lx_string(lexer *lx, size_t start, size_t qpos, int nest) {
  int fstr = 0;
  for (size_t i = start; i < qpos; i++) {
    char c = lx->s[i];
    if (c == 'f' || c == 'F' || c == 't' || c == 'T') fstr = 1;
  }
  char q = lx->s[qpos];
  int triple = qpos + 2 < lx->n && lx->s[qpos + 1] == q && lx->s[qpos + 2] == q;
  size_t idx = lx_emit(lx, BH_TOK_STRING, start, 0);
  lx->p = qpos + (triple ? 3 : 1);
  if (fstr && nest < MAX_NEST) lx_fbody(lx, q, triple, nest + 1, 0);
  else lx_plain_body(lx, q, triple);
  if (idx != NONE && !lx->err) lx->t[idx].len = (uint32_t)(lx->p - start);
}

static int is_prefix(const char *s, size_t n) {
  if (n > 3) return 0;
  for (size_t i = 0; i < n; i++)
    if (!strchr("rRbBuUfFtT", s[i])) return 0;
  return 1;
}

static const char *const OPS3[] = {"**=", "//=", ">>=", "<<=", "...", NULL};
static const char *const OPS2[] = {"**", "//", ">>", "<<", "<=", ">=", "==", "!=", "->", ":=",
                                   "+=", "-=", "*=", "/=", "%=", "&=", "|=", "^=", "@=", NULL};

/* One token at lx->p that is not whitespace, a comment or a newline.
 * Brackets count towards the line's depth only outside f-string fields. */
static void lx_token(lexer *lx, int nest, int in_field) {
  const char *s = lx->s;
  size_t p = lx->p, n = lx->n;
  unsigned char c = (unsigned char)s[p];
  if (name_start(c)) {
    size_t q = p;
    while (q < n && name_char((unsigned char)s[q])) q++;
    if (q < n && (s[q] == '"' || s[q] == '\'') && is_prefix(s + p, q - p)) {
      lx_string(lx, p, q, nest);
      return;
    }
    lx_emit(lx, BH_TOK_NAME, p, q - p);
    lx->p = q;
    return;
  }
  if (digit(c) || (c == '.' && p + 1 < n && digit((unsigned char)s[p + 1]))) {
    size_t q = p;
    int hex = c == '0' && p + 1 < n && (s[p + 1] == 'x' || s[p + 1] == 'X');
    while (q < n) {
      unsigned char d = (unsigned char)s[q];
      if (name_char(d) || d == '.') q++;
      else if ((d == '+' || d == '-') && !hex && q > p && (s[q - 1] == 'e' || s[q - 1] == 'E')) q++;
      else break;
    }
    lx_emit(lx, BH_TOK_NUMBER, p, q - p);
    lx->p = q;
    return;
  }
  if (c == '"' || c == '\'') {
    lx_string(lx, p, p, nest);
    return;
  }
  size_t len = 1;
  for (int i = 0; OPS3[i]; i++)
    if (p + 3 <= n && memcmp(s + p, OPS3[i], 3) == 0) len = 3;
  if (len == 1)
    for (int i = 0; OPS2[i]; i++)
      if (p + 2 <= n && memcmp(s + p, OPS2[i], 2) == 0) len = 2;
  if (len == 1 && !in_field) {
    if (c == '(' || c == '[' || c == '{') lx->depth++;
    else if ((c == ')' || c == ']' || c == '}') && lx->depth > 0) lx->depth--;
  }
  lx_emit(lx, BH_TOK_OP, p, len);
  lx->p = p + len;
}

int bh_canary_tokenize(const char *src, size_t len, bh_canary_token **out, size_t *n) {
  if (!out || !n || (!src && len)) return -EINVAL;
  *out = NULL, *n = 0;
  if (len > BH_CANARY_MAX_SOURCE) return -EFBIG;
  lexer lx = {.s = src ? src : "", .n = len, .line = 1};
  int bol = 1;
  while (lx.p < lx.n && !lx.err) {
    if (bol) {
      bol = 0;
      if (lx.depth == 0) {
        int32_t col = 0;
        while (lx.p < lx.n) {
          char c = lx.s[lx.p];
          if (c == ' ') col++;
          else if (c == '\t') col = (col / 8 + 1) * 8;
          else if (c == '\f') col = 0;
          else break;
          if (col > MAX_COLUMN) col = MAX_COLUMN;
          lx.p++;
        }
        if (!lx.has_tokens) lx.indent = col;
      }
      continue;
    }
    char c = lx.s[lx.p];
    size_t nl = lx_nl(&lx, lx.p);
    if (nl) {
      lx.p += nl;
      lx.line++;
      if (lx.depth == 0) {
        if (lx.has_tokens) lx_emit(&lx, BH_TOK_NEWLINE, lx.p - nl, nl);
        lx.has_tokens = 0;
      }
      bol = 1;
      continue;
    }
    if (c == ' ' || c == '\t' || c == '\f') {
      lx.p++;
      continue;
    }
    if (c == '#') {
      while (lx.p < lx.n && !lx_nl(&lx, lx.p)) lx.p++;
      continue;
    }
    if (c == '\\') {
      size_t nl2 = lx_nl(&lx, lx.p + 1);
      if (nl2) {
        lx.p += 1 + nl2;
        lx.line++;
        continue;
      }
      lx_emit(&lx, BH_TOK_OP, lx.p, 1);
      lx.p++;
      continue;
    }
    lx_token(&lx, 0, 0);
  }
  if (lx.has_tokens) lx_emit(&lx, BH_TOK_NEWLINE, lx.n, 0);
  lx.has_tokens = 1; /* END carries no indentation */
  lx_emit(&lx, BH_TOK_END, lx.n, 0);
  if (lx.err) {
    free(lx.t);
    return lx.err;
  }
  *out = lx.t, *n = lx.nt;
  return 0;
}

/* ------------------------------------------------------------ analysis */

enum kind { K_UNKNOWN, K_ENTRY, K_PATCHER, K_INNER, K_ENTRIES, K_PATCHERS, K_ENUM_ENTRIES, K_ENUM_PATCHERS };

typedef struct {
  uint32_t tok;  /* the name is this token's text */
  int32_t prev;  /* the binding it shadows (same name, outer), or -1 */
  uint8_t kind;
} binding;

/* Names with bindings, by text: the innermost binding of each. */
typedef struct {
  uint32_t tok;
  int32_t top; /* index into binds, -1 when none is live */
} name_slot;

typedef struct {
  uint32_t tok, lo, hi; /* bound inside the bracket group (lo, hi) */
  uint8_t kind;
} comp_binding;

enum { FR_MODULE, FR_CLASS, FR_DEF, FR_IF, FR_OTHER };

typedef struct {
  int32_t indent;
  uint8_t kind;
  uint8_t gated;            /* all of it is reached only when dynamic */
  uint8_t rest_gated;       /* an early exit gated the rest of it */
  uint8_t last_term;        /* its last direct statement exits */
  uint8_t chain;            /* its last direct statement was an if/elif */
  uint8_t chain_else_gated; /* ... and a later elif/else is gated */
  uint8_t chain_all_term;   /* every branch of that chain so far exits */
  uint8_t chain_ok;         /* FR_IF: every earlier branch of its chain exits */
  uint8_t cond_false_dyn;   /* FR_IF: its condition False implies dynamic */
  uint8_t loaded_model;     /* FR_CLASS: class LoadedModel */
  size_t bind_base;         /* bindings of this function start here */
} frame;

typedef struct {
  const char *src;
  const bh_canary_token *t;
  size_t nt;
  int32_t *match;  /* opener -> its closer (or the line's end) */
  uint8_t *gate;   /* token reached only when dynamic */
  int32_t *dyn;    /* is_dynamic names before each token */
  int32_t *stack;
  binding *binds;
  size_t nbinds, capbinds;
  name_slot *slots; /* open addressing; tok == UINT32_MAX is empty */
  size_t nslots, capslots;
  comp_binding comps[MAX_COMPS];
  size_t ncomps;
  frame *frames;
  size_t nframes, capframes;
  bh_canary_name *names;
  size_t nnames, capnames;
  uint32_t *hash; /* index + 1 into names, open addressing */
  size_t hcap;
  int err;
} analyzer;

static const char *tx(const analyzer *A, size_t i) { return A->src + A->t[i].off; }

static int teq(const analyzer *A, size_t i, const char *s) {
  size_t n = strlen(s);
  return A->t[i].len == n && memcmp(tx(A, i), s, n) == 0;
}

static int is_name(const analyzer *A, size_t i, const char *s) {
  return A->t[i].kind == BH_TOK_NAME && teq(A, i, s);
}

static int is_op(const analyzer *A, size_t i, const char *s) {
  return A->t[i].kind == BH_TOK_OP && teq(A, i, s);
}

static int is_open(const analyzer *A, size_t i) {
  if (A->t[i].kind == BH_TOK_FOPEN) return 1;
  return A->t[i].kind == BH_TOK_OP && A->t[i].len == 1 && strchr("([{", tx(A, i)[0]);
}

static int is_close(const analyzer *A, size_t i) {
  return A->t[i].kind == BH_TOK_OP && A->t[i].len == 1 && strchr(")]}", tx(A, i)[0]);
}

static const char *const KEYWORDS[] = {
    "False", "None", "True", "and", "as", "assert", "async", "await", "break", "class",
    "continue", "def", "del", "elif", "else", "except", "finally", "for", "from", "global",
    "if", "import", "in", "is", "lambda", "nonlocal", "not", "or", "pass", "raise",
    "return", "try", "while", "with", "yield", NULL};

static int is_keyword(const analyzer *A, size_t i) {
  if (A->t[i].kind != BH_TOK_NAME) return 0;
  for (int k = 0; KEYWORDS[k]; k++)
    if (teq(A, i, KEYWORDS[k])) return 1;
  return 0;
}

/* A name that can start an access chain. */
static int is_ident(const analyzer *A, size_t i) {
  return A->t[i].kind == BH_TOK_NAME && !is_keyword(A, i);
}

static int same_text(const analyzer *A, size_t i, size_t j) {
  return A->t[i].len == A->t[j].len && memcmp(tx(A, i), tx(A, j), A->t[i].len) == 0;
}

static int is_assign_op(const analyzer *A, size_t i) {
  static const char *const ops[] = {"=", "+=", "-=", "*=", "/=", "//=", "%=", "**=", ">>=",
                                    "<<=", "&=", "|=", "^=", "@=", NULL};
  if (A->t[i].kind != BH_TOK_OP) return 0;
  for (int k = 0; ops[k]; k++)
    if (teq(A, i, ops[k])) return 1;
  return 0;
}

/* Bracket matching over one logical line [a, b).  A closer that does not
 * fit closes the innermost group anyway (but never crosses an f-string
 * field); FCLOSE closes everything inside its field; groups still open at
 * the end close at b. */
static void match_line(analyzer *A, size_t a, size_t b) {
  size_t sp = 0;
  for (size_t i = a; i < b; i++) {
    A->match[i] = -1;
    if (is_open(A, i)) {
      A->stack[sp++] = (int32_t)i;
    } else if (A->t[i].kind == BH_TOK_FCLOSE) {
      while (sp > 0) {
        size_t o = (size_t)A->stack[--sp];
        A->match[o] = (int32_t)i;
        if (A->t[o].kind == BH_TOK_FOPEN) break;
      }
    } else if (is_close(A, i)) {
      if (sp > 0 && A->t[A->stack[sp - 1]].kind != BH_TOK_FOPEN)
        A->match[A->stack[--sp]] = (int32_t)i;
    }
  }
  while (sp > 0) A->match[A->stack[--sp]] = (int32_t)b;
}

/* The closer of the group opened at i, or e if it lies beyond. */
static size_t group_end(const analyzer *A, size_t i, size_t e) {
  int32_t m = A->match[i];
  return (m < 0 || (size_t)m >= e) ? e : (size_t)m;
}

/* The token after the group opened at i (at most e). */
static size_t skip(const analyzer *A, size_t i, size_t e) {
  size_t m = group_end(A, i, e);
  return m < e ? m + 1 : e;
}

static int has_dyn(const analyzer *A, size_t s, size_t e) { return s < e && A->dyn[e] > A->dyn[s]; }

/* First depth-0 token in [s, e) that is the keyword kw, or NONE. */
static size_t find_kw(const analyzer *A, size_t s, size_t e, const char *kw) {
  for (size_t i = s; i < e;) {
    if (is_open(A, i)) {
      i = skip(A, i, e);
      continue;
    }
    if (is_name(A, i, kw)) return i;
    i++;
  }
  return NONE;
}

/* Skips the trailers of an access chain starting at the name s. */
static size_t chain_end(const analyzer *A, size_t s, size_t e) {
  size_t j = s + 1;
  while (j < e) {
    if (is_op(A, j, ".") && j + 1 < e && A->t[j + 1].kind == BH_TOK_NAME) j += 2;
    else if (is_op(A, j, "(") || is_op(A, j, "[")) j = skip(A, j, e);
    else break;
  }
  return j;
}

/* Does [s, e) being True (pol 1) or False (pol 0) guarantee that some
 * `.is_dynamic()` returned True? */
static int implies(const analyzer *A, size_t s, size_t e, int pol, int lvl) {
  if (lvl > MAX_DEPTH || !has_dyn(A, s, e)) return 0;
  static const char *const ops[] = {"or", "and"};
  for (int o = 0; o < 2; o++) {
    if (find_kw(A, s, e, ops[o]) == NONE) continue;
    /* "or" True / "and" False: every operand; "or" False / "and" True: any. */
    int every = (o == 0) == (pol == 1);
    size_t start = s;
    for (size_t i = s;; i++) {
      if (i < e && is_open(A, i)) {
        i = skip(A, i, e) - 1;
        continue;
      }
      if (i >= e || is_name(A, i, ops[o])) {
        int r = implies(A, start, i, pol, lvl + 1);
        if (every && !r) return 0;
        if (!every && r) return 1;
        if (i >= e) break;
        start = i + 1;
      }
    }
    return every;
  }
  while (s < e && is_name(A, s, "not")) s++, pol = !pol; /* no and/or left at this level */
  if (s >= e) return 0;
  if (is_op(A, s, "(") && group_end(A, s, e) == e - 1) return implies(A, s + 1, e - 1, pol, lvl + 1);
  if (find_kw(A, s, e, "if") != NONE || find_kw(A, s, e, "lambda") != NONE) return 0;
  /* An atom: exactly `<chain>.is_dynamic()`. */
  if (!is_ident(A, s) || chain_end(A, s, e) != e || e - s < 5) return 0;
  if (!(is_op(A, e - 2, "(") && is_close(A, e - 1) && is_name(A, e - 3, "is_dynamic") &&
        is_op(A, e - 4, ".")))
    return 0;
  return pol;
}

static void fill(analyzer *A, size_t s, size_t e) {
  if (s < e) memset(A->gate + s, 1, e - s);
}

static void mark_seq(analyzer *A, size_t s, size_t e, int g, int lvl);

/* One operand of and/or: groups inside it are sequences of their own. */
static void mark_operand(analyzer *A, size_t s, size_t e, int g, int lvl) {
  if (g) {
    fill(A, s, e);
    return;
  }
  for (size_t i = s; i < e;) {
    if (is_open(A, i)) {
      size_t m = group_end(A, i, e);
      mark_seq(A, i + 1, m, 0, lvl + 1);
      i = m < e ? m + 1 : e;
      continue;
    }
    i++;
  }
}

/* and / or with short-circuit: a later operand is evaluated only when the
 * earlier ones were True (and) / False (or). */
static void mark_bool(analyzer *A, size_t s, size_t e, int g, int lvl, int level) {
  if (g) {
    fill(A, s, e);
    return;
  }
  const char *op = level == 0 ? "or" : "and";
  int acc = 0;
  size_t start = s;
  for (size_t i = s;; i++) {
    if (i < e && is_open(A, i)) {
      i = skip(A, i, e) - 1;
      continue;
    }
    if (i >= e || is_name(A, i, op)) {
      if (level == 0) mark_bool(A, start, i, acc, lvl, 1);
      else mark_operand(A, start, i, acc, lvl);
      if (!acc) acc = implies(A, start, i, level == 0 ? 0 : 1, lvl + 1);
      if (i >= e) break;
      start = i + 1;
    }
  }
}

/* Ternaries: `A if C else B`. */
static void mark_expr(analyzer *A, size_t s, size_t e, int g, int lvl) {
  if (g || lvl > MAX_DEPTH) {
    if (g) fill(A, s, e);
    return;
  }
  size_t p = find_kw(A, s, e, "if");
  if (p == NONE || p == s) {
    mark_bool(A, s, e, 0, lvl, 0);
    return;
  }
  size_t q = find_kw(A, p + 1, e, "else");
  size_t ce = q == NONE ? e : q;
  mark_bool(A, s, p, implies(A, p + 1, ce, 1, lvl + 1), lvl, 0);
  mark_bool(A, p + 1, ce, 0, lvl, 0);
  if (q != NONE) mark_expr(A, q + 1, e, implies(A, p + 1, ce, 0, lvl + 1), lvl + 1);
}

/* An item of a sequence: a comprehension, or an expression. */
static void mark_item(analyzer *A, size_t s, size_t e, int g, int lvl) {
  static const char *const lead[] = {"if", "elif", "while", "else", "with", "except", "return",
                                     "yield", "assert", "del", "raise", "await", "async", NULL};
  for (int again = 1; again && s < e;) {
    again = 0;
    for (int k = 0; lead[k]; k++)
      if (is_name(A, s, lead[k])) {
        s++, again = 1;
        break;
      }
  }
  if (s >= e) return;
  size_t f = find_kw(A, s, e, "for");
  if (f == NONE) {
    mark_expr(A, s, e, g, lvl);
    return;
  }
  /* element for T in ITER [if C | for T in ITER]... */
  int filtered = 0;
  size_t i = f;
  while (i < e) {
    size_t next = e;
    for (size_t j = i + 1; j < e;) {
      if (is_open(A, j)) {
        j = skip(A, j, e);
        continue;
      }
      if (is_name(A, j, "for") || is_name(A, j, "if") || is_name(A, j, "async")) {
        next = j;
        break;
      }
      j++;
    }
    if (is_name(A, i, "if")) {
      mark_expr(A, i + 1, next, g || filtered, lvl + 1);
      if (!filtered) filtered = implies(A, i + 1, next, 1, lvl + 1);
    } else {
      size_t in = find_kw(A, i + 1, next, "in");
      if (in != NONE) mark_expr(A, in + 1, next, g || filtered, lvl + 1);
    }
    i = next;
  }
  mark_expr(A, s, f, g || filtered, lvl + 1);
}

/* A sequence of items separated by `,`, `=`, `:` and the like. */
static void mark_seq(analyzer *A, size_t s, size_t e, int g, int lvl) {
  if (g) {
    fill(A, s, e);
    return;
  }
  if (lvl > MAX_DEPTH) return;
  static const char *const seps[] = {",", ";", ":", ":=", "->", NULL};
  size_t start = s;
  for (size_t i = s; i < e;) {
    if (is_open(A, i)) {
      i = skip(A, i, e);
      continue;
    }
    int sep = is_assign_op(A, i);
    for (int k = 0; !sep && seps[k]; k++) sep = is_op(A, i, seps[k]);
    if (!sep && A->t[i].kind == BH_TOK_NAME)
      sep = teq(A, i, "lambda") || teq(A, i, "import") || teq(A, i, "from") ||
            teq(A, i, "global") || teq(A, i, "nonlocal");
    if (sep) {
      mark_item(A, start, i, 0, lvl);
      start = i + 1;
    }
    i++;
  }
  mark_item(A, start, e, 0, lvl);
}

/* ---------------------------------------------------- names and bindings */

static frame *top(analyzer *A) { return &A->frames[A->nframes - 1]; }

static size_t scope_base(const analyzer *A) { return A->frames[A->nframes - 1].bind_base; }

static uint64_t hash_text(const char *s, size_t n);

/* The slot of the name at token tok; with create, made when missing
 * (NULL once out of memory). */
static name_slot *slot_of(analyzer *A, size_t tok, int create) {
  if (create && (A->nslots + 1) * 2 > A->capslots) {
    size_t cap = A->capslots ? A->capslots * 2 : 64;
    name_slot *ns = malloc(cap * sizeof *ns);
    if (!ns) {
      A->err = -ENOMEM;
      return NULL;
    }
    for (size_t k = 0; k < cap; k++) ns[k] = (name_slot){.tok = UINT32_MAX, .top = -1};
    for (size_t k = 0; k < A->capslots; k++) {
      if (A->slots[k].tok == UINT32_MAX) continue;
      size_t h = hash_text(tx(A, A->slots[k].tok), A->t[A->slots[k].tok].len) & (cap - 1);
      while (ns[h].tok != UINT32_MAX) h = (h + 1) & (cap - 1);
      ns[h] = A->slots[k];
    }
    free(A->slots);
    A->slots = ns, A->capslots = cap;
  }
  if (!A->capslots) return NULL;
  size_t h = hash_text(tx(A, tok), A->t[tok].len) & (A->capslots - 1);
  while (A->slots[h].tok != UINT32_MAX) {
    if (same_text(A, A->slots[h].tok, tok)) return &A->slots[h];
    h = (h + 1) & (A->capslots - 1);
  }
  if (!create) return NULL;
  A->slots[h] = (name_slot){.tok = (uint32_t)tok, .top = -1};
  A->nslots++;
  return &A->slots[h];
}

/* Drops the bindings from index base on (a function's scope ended). */
static void unbind_to(analyzer *A, size_t base) {
  while (A->nbinds > base) {
    const binding *b = &A->binds[--A->nbinds];
    name_slot *sl = slot_of(A, b->tok, 0);
    if (sl) sl->top = b->prev;
  }
}

/* The kind of the name at token i (at: where it is used, for
 * comprehension variables; NONE for none). */
static int lookup(const analyzer *A, size_t i, size_t at) {
  if (at != NONE) {
    size_t best = NONE, width = NONE;
    for (size_t c = 0; c < A->ncomps; c++) {
      const comp_binding *cb = &A->comps[c];
      if (cb->lo < at && at < cb->hi && same_text(A, cb->tok, i) && cb->hi - cb->lo < width)
        best = c, width = cb->hi - cb->lo;
    }
    if (best != NONE) return A->comps[best].kind;
  }
  const name_slot *sl = slot_of((analyzer *)A, i, 0); /* no create: nothing changes */
  if (sl && sl->top >= 0) return A->binds[sl->top].kind;
  if (teq(A, i, "current_loaded_models")) return K_ENTRIES;
  return K_UNKNOWN;
}

static void bind(analyzer *A, size_t tok, int kind) {
  if (A->err) return;
  name_slot *sl = slot_of(A, tok, 1);
  if (!sl) return;
  if (sl->top >= 0 && (size_t)sl->top >= scope_base(A)) { /* rebound in this function */
    A->binds[sl->top].kind = (uint8_t)kind;
    return;
  }
  if (kind == K_UNKNOWN && (sl->top < 0 || A->binds[sl->top].kind == K_UNKNOWN)) return;
  if (A->nbinds == A->capbinds) {
    size_t cap = A->capbinds ? A->capbinds * 2 : 64;
    binding *nb = realloc(A->binds, cap * sizeof *nb);
    if (!nb) {
      A->err = -ENOMEM;
      return;
    }
    A->binds = nb, A->capbinds = cap;
  }
  A->binds[A->nbinds] = (binding){.tok = (uint32_t)tok, .prev = sl->top, .kind = (uint8_t)kind};
  sl->top = (int32_t)A->nbinds++;
}

static void comp_bind(analyzer *A, size_t tok, int kind, size_t lo, size_t hi) {
  if (A->ncomps < MAX_COMPS)
    A->comps[A->ncomps++] =
        (comp_binding){.tok = (uint32_t)tok, .lo = (uint32_t)lo, .hi = (uint32_t)hi, .kind = (uint8_t)kind};
}

static int list_kind(int k) { return k == K_ENTRIES || k == K_PATCHERS; }

/* ------------------------------------------------------------ the record */

static uint64_t hash_text(const char *s, size_t n) {
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
  return h;
}

/* The record for a name, created on first use; -1 out of memory. */
static long rec_get(analyzer *A, const char *s, size_t n) {
  if (A->err) return -1;
  if (A->hcap == 0 || (A->nnames + 1) * 2 > A->hcap) {
    size_t cap = A->hcap ? A->hcap * 2 : 64;
    uint32_t *h = calloc(cap, sizeof *h);
    if (!h) goto oom;
    for (size_t r = 0; r < A->nnames; r++) {
      size_t k = hash_text(A->names[r].name, strlen(A->names[r].name)) & (cap - 1);
      while (h[k]) k = (k + 1) & (cap - 1);
      h[k] = (uint32_t)(r + 1);
    }
    free(A->hash);
    A->hash = h, A->hcap = cap;
  }
  size_t k = hash_text(s, n) & (A->hcap - 1);
  while (A->hash[k]) {
    const char *nm = A->names[A->hash[k] - 1].name;
    if (strlen(nm) == n && memcmp(nm, s, n) == 0) return (long)A->hash[k] - 1;
    k = (k + 1) & (A->hcap - 1);
  }
  if (A->nnames == A->capnames) {
    size_t cap = A->capnames ? A->capnames * 2 : 32;
    bh_canary_name *nn = realloc(A->names, cap * sizeof *nn);
    if (!nn) goto oom;
    A->names = nn, A->capnames = cap;
  }
  char *copy = malloc(n + 1);
  if (!copy) goto oom;
  memcpy(copy, s, n);
  copy[n] = '\0';
  A->names[A->nnames] = (bh_canary_name){.name = copy};
  A->hash[k] = (uint32_t)(A->nnames + 1);
  return (long)A->nnames++;
oom:
  A->err = -ENOMEM;
  return -1;
}

/* The arguments of the call whose '(' is at open. */
static int call_shape(analyzer *A, size_t open, size_t e, bh_canary_shape *sh) {
  size_t m = group_end(A, open, e);
  size_t cap = 1, used = 0;
  char *kw = NULL;
  int rc = 0;
  memset(sh, 0, sizeof *sh);
  size_t start = open + 1;
  for (size_t i = open + 1;; i++) {
    if (i < m && is_open(A, i)) {
      i = skip(A, i, m) - 1;
      continue;
    }
    if (i < m && !is_op(A, i, ",")) continue;
    if (start < i) {
      if (is_op(A, start, "*")) sh->star = 1;
      else if (is_op(A, start, "**")) sh->kwstar = 1;
      else if (A->t[start].kind == BH_TOK_NAME && start + 1 < i && is_op(A, start + 1, "=")) {
        size_t len = A->t[start].len;
        if (used + len + 2 > cap) {
          size_t ncap = (used + len + 2) * 2;
          char *nk = realloc(kw, ncap);
          if (!nk) {
            rc = -ENOMEM;
            goto out;
          }
          kw = nk, cap = ncap;
        }
        if (used) kw[used++] = ',';
        memcpy(kw + used, tx(A, start), len);
        used += len;
      } else {
        sh->positional++;
      }
    }
    if (i >= m) break;
    start = i + 1;
  }
  if (!kw && !(kw = malloc(1))) {
    rc = -ENOMEM;
    goto out;
  }
  kw[used] = '\0';
  sh->keywords = kw, kw = NULL;
out:
  free(kw);
  return rc;
}

static void use(analyzer *A, const char *s, size_t n, size_t at, unsigned how, size_t open, size_t e) {
  long r = rec_get(A, s, n);
  if (r < 0) return;
  bh_canary_name *R = &A->names[r];
  int line = A->t[at].line;
  if (A->gate[at]) {
    R->gated_uses |= how;
    if (!R->gated_line) R->gated_line = line;
    return;
  }
  /* The first use that decides the class: a real use outranks a probe. */
  if (!R->line || (how != BH_CANARY_PROBE && R->uses == BH_CANARY_PROBE)) R->line = line;
  R->uses |= how;
  if (how != BH_CANARY_CALL || open == NONE || R->nshapes >= MAX_SHAPES) return;
  bh_canary_shape sh;
  int rc = call_shape(A, open, e, &sh);
  if (rc < 0) {
    A->err = rc;
    return;
  }
  for (size_t k = 0; k < R->nshapes; k++) {
    const bh_canary_shape *o = &R->shapes[k];
    if (o->positional == sh.positional && o->star == sh.star && o->kwstar == sh.kwstar &&
        strcmp(o->keywords, sh.keywords) == 0) {
      free(sh.keywords);
      return;
    }
  }
  bh_canary_shape *ns = realloc(R->shapes, (R->nshapes + 1) * sizeof *ns);
  if (!ns) {
    free(sh.keywords);
    A->err = -ENOMEM;
    return;
  }
  sh.line = line;
  ns[R->nshapes] = sh;
  R->shapes = ns, R->nshapes++;
}

/* ------------------------------------------------------------- chains */

static size_t walk(analyzer *A, size_t i, size_t e, int record, int lvl, int *kind_out);

/* The kind of [s, e) when it is exactly one access chain (in parentheses
 * or not). */
static int eval_kind(analyzer *A, size_t s, size_t e, int lvl) {
  if (lvl > MAX_DEPTH) return K_UNKNOWN;
  while (s + 1 < e && is_op(A, s, "(") && group_end(A, s, e) == e - 1) s++, e--;
  if (s >= e || !is_ident(A, s)) return K_UNKNOWN;
  int k;
  size_t end = walk(A, s, e, 0, lvl + 1, &k);
  return end == e ? k : K_UNKNOWN;
}

/* The n-th (0-based) positional argument of the call at open: [*s, *e). */
static int nth_arg(const analyzer *A, size_t open, size_t e, int nth, size_t *as, size_t *ae) {
  size_t m = group_end(A, open, e), start = open + 1;
  int pos = 0;
  for (size_t i = open + 1;; i++) {
    if (i < m && is_open(A, i)) {
      i = skip(A, i, m) - 1;
      continue;
    }
    if (i < m && !is_op(A, i, ",")) continue;
    if (start < i && !is_op(A, start, "*") && !is_op(A, start, "**") &&
        !(start + 1 < i && is_op(A, start + 1, "="))) {
      if (pos == nth) {
        *as = start, *ae = i;
        return 1;
      }
      pos++;
    }
    if (i >= m) return 0;
    start = i + 1;
  }
}

static int elem_of(int k) {
  if (k == K_ENTRIES) return K_ENTRY;
  if (k == K_PATCHERS) return K_PATCHER;
  return K_UNKNOWN;
}

/* hasattr(p, "name") / getattr(p, "name"[, default]) on a patcher. */
static void probe(analyzer *A, size_t fn, size_t open, size_t e, int lvl) {
  size_t s0, e0, s1, e1, s2, e2;
  if (!nth_arg(A, open, e, 0, &s0, &e0) || !nth_arg(A, open, e, 1, &s1, &e1)) return;
  if (e1 != s1 + 1 || A->t[s1].kind != BH_TOK_STRING) return;
  const char *str = tx(A, s1);
  size_t len = A->t[s1].len;
  if (len < 3 || (str[0] != '"' && str[0] != '\'') || str[len - 1] != str[0]) return;
  str++, len -= 2;
  if (!name_start((unsigned char)str[0])) return;
  for (size_t k = 0; k < len; k++)
    if (!name_char((unsigned char)str[k])) return;
  if (eval_kind(A, s0, e0, lvl + 1) != K_PATCHER) return;
  int has_default = nth_arg(A, open, e, 2, &s2, &e2);
  if (teq(A, fn, "hasattr") || has_default) {
    use(A, str, len, s1, BH_CANARY_PROBE, NONE, e);
    return;
  }
  size_t after = skip(A, open, e);
  if (after < e && is_op(A, after, "(")) use(A, str, len, s1, BH_CANARY_CALL, after, e);
  else use(A, str, len, s1, BH_CANARY_READ, NONE, e);
}

/* lst.append(x) / lst.add(x) / lst.insert(i, x): lst holds what x is. */
static void list_grows(analyzer *A, size_t base, size_t method, size_t open, size_t e, int lvl) {
  int nth;
  if (teq(A, method, "append") || teq(A, method, "add")) nth = 0;
  else if (teq(A, method, "insert")) nth = 1;
  else return;
  size_t s, ae;
  if (!nth_arg(A, open, e, nth, &s, &ae)) return;
  int k = eval_kind(A, s, ae, lvl + 1);
  if ((k != K_ENTRY && k != K_PATCHER) || lookup(A, base, NONE) != K_UNKNOWN) return;
  bind(A, base, k == K_ENTRY ? K_ENTRIES : K_PATCHERS);
}

static int attr_kind(const analyzer *A, int k, size_t nm, int call) {
  switch (k) {
  case K_ENTRIES:
  case K_PATCHERS:
    if (call && teq(A, nm, "pop")) return elem_of(k);
    if (call && teq(A, nm, "copy")) return k;
    return K_UNKNOWN;
  case K_ENTRY:
    return !call && teq(A, nm, "model") ? K_PATCHER : K_UNKNOWN;
  case K_PATCHER:
    if (!call && teq(A, nm, "model")) return K_INNER;
    if (call && (teq(A, nm, "model_patches_models") || teq(A, nm, "get_nested_additional_models")))
      return K_PATCHERS;
    return K_UNKNOWN;
  case K_UNKNOWN: /* `<x>.model` is taken to be a ledger entry's */
    return !call && teq(A, nm, "model") ? K_PATCHER : K_UNKNOWN;
  default:
    return K_UNKNOWN;
  }
}

/* An access chain from the name at i; returns where it ends and sets the
 * kind of its value.  With record set, members read off patchers are
 * recorded and list.append() bindings made. */
static size_t walk(analyzer *A, size_t i, size_t e, int record, int lvl, int *kind_out) {
  static const char *const passthrough[] = {"sorted", "reversed", "list", "tuple", "set",
                                            "frozenset", "iter", NULL};
  size_t j = i + 1;
  int k = lookup(A, i, i), builtin = 0;
  if (j < e && is_op(A, j, "(") && k == K_UNKNOWN && lvl <= MAX_DEPTH) {
    size_t s, ae;
    if (teq(A, i, "LoadedModel")) {
      k = K_ENTRY, builtin = 1;
    } else if (teq(A, i, "enumerate")) {
      int ak = nth_arg(A, j, e, 0, &s, &ae) ? eval_kind(A, s, ae, lvl + 1) : K_UNKNOWN;
      k = ak == K_ENTRIES ? K_ENUM_ENTRIES : ak == K_PATCHERS ? K_ENUM_PATCHERS : K_UNKNOWN;
      builtin = 1;
    } else {
      for (int p = 0; passthrough[p]; p++)
        if (teq(A, i, passthrough[p])) {
          int ak = nth_arg(A, j, e, 0, &s, &ae) ? eval_kind(A, s, ae, lvl + 1) : K_UNKNOWN;
          k = list_kind(ak) ? ak : K_UNKNOWN;
          builtin = 1;
          break;
        }
      if (!builtin && record && (teq(A, i, "getattr") || teq(A, i, "hasattr")))
        probe(A, i, j, e, lvl);
    }
    if (builtin) j = skip(A, j, e);
  }
  int first = 1;
  while (j < e) {
    if (is_op(A, j, ".") && j + 1 < e && A->t[j + 1].kind == BH_TOK_NAME) {
      size_t nm = j + 1, after = j + 2;
      int call = after < e && is_op(A, after, "(");
      if (record && k == K_PATCHER) {
        unsigned how = call ? BH_CANARY_CALL
                            : (after < e && is_assign_op(A, after)) ? BH_CANARY_WRITE : BH_CANARY_READ;
        use(A, tx(A, nm), A->t[nm].len, nm, how, call ? after : NONE, e);
      }
      if (record && call && first && !builtin) list_grows(A, i, nm, after, e, lvl);
      k = attr_kind(A, k, nm, call);
      j = call ? skip(A, after, e) : after;
    } else if (is_op(A, j, "(")) {
      k = K_UNKNOWN;
      j = skip(A, j, e);
    } else if (is_op(A, j, "[")) {
      size_t m = group_end(A, j, e);
      int slice = 0;
      for (size_t x = j + 1; !slice && x < m;) {
        if (is_open(A, x)) {
          x = skip(A, x, m);
          continue;
        }
        slice = is_op(A, x, ":");
        x++;
      }
      k = slice ? (list_kind(k) ? k : K_UNKNOWN) : elem_of(k);
      j = skip(A, j, e);
    } else {
      break;
    }
    first = 0;
  }
  *kind_out = k;
  return j;
}

/* Every access chain in [s, e), recorded. */
static void scan(analyzer *A, size_t s, size_t e) {
  for (size_t i = s; i < e && !A->err; i++) {
    if (!is_ident(A, i) || (i > s && is_op(A, i - 1, "."))) continue;
    int k;
    walk(A, i, e, 1, 0, &k);
  }
}

/* ------------------------------------------------------------ bindings */

/* A for target [s, e) over values of kind k (K_ENUM_*: (index, value)). */
static void bind_target(analyzer *A, size_t s, size_t e, int k, size_t lo, size_t hi) {
  while (s + 1 < e && is_op(A, s, "(") && group_end(A, s, e) == e - 1) s++, e--;
  int elem = k == K_ENUM_ENTRIES ? K_ENTRY : k == K_ENUM_PATCHERS ? K_PATCHER : K_UNKNOWN;
  int single = e == s + 1 && is_ident(A, s);
  int pair = e == s + 3 && is_ident(A, s) && is_op(A, s + 1, ",") && is_ident(A, s + 2);
  for (size_t i = s; i < e; i++) {
    if (!is_ident(A, i) || (i > s && is_op(A, i - 1, "."))) continue;
    int kind = K_UNKNOWN;
    if (single && k != K_ENUM_ENTRIES && k != K_ENUM_PATCHERS) kind = k;
    else if (pair && i == s + 2) kind = elem;
    if (lo != NONE) comp_bind(A, i, kind, lo, hi);
    else bind(A, i, kind);
  }
}

static int iter_kind(analyzer *A, size_t s, size_t e) {
  int k = eval_kind(A, s, e, 0);
  if (k == K_ENUM_ENTRIES || k == K_ENUM_PATCHERS) return k;
  return elem_of(k);
}

/* Comprehension variables of every bracket group in [s, e). */
static void comps_prepass(analyzer *A, size_t s, size_t e) {
  A->ncomps = 0;
  for (size_t o = s; o < e; o++) {
    if (!is_open(A, o) || A->t[o].kind == BH_TOK_FOPEN) continue;
    size_t m = group_end(A, o, e);
    for (size_t i = o + 1; i < m;) {
      if (is_open(A, i)) {
        i = skip(A, i, m);
        continue;
      }
      if (!is_name(A, i, "for")) {
        i++;
        continue;
      }
      size_t in = NONE, end = m, j = i + 1;
      while (j < m) {
        if (is_open(A, j)) {
          j = skip(A, j, m);
          continue;
        }
        if (in == NONE && is_name(A, j, "in")) in = j;
        else if (in != NONE && (is_name(A, j, "for") || is_name(A, j, "if") || is_name(A, j, "async"))) {
          end = j;
          break;
        }
        j++;
      }
      if (in == NONE) break;
      bind_target(A, i + 1, in, iter_kind(A, in + 1, end), o, m);
      i = end;
    }
  }
}

/* name = value, a = b = value, name: T = value, tuple targets. */
static void bind_assign(analyzer *A, size_t s, size_t e) {
  size_t last = NONE;
  for (size_t i = s; i < e;) {
    if (is_open(A, i)) {
      i = skip(A, i, e);
      continue;
    }
    if (is_op(A, i, "=")) last = i;
    i++;
  }
  if (last == NONE) return;
  int k = eval_kind(A, last + 1, e, 0);
  size_t start = s;
  for (size_t i = s; i <= last;) {
    if (i < last && is_open(A, i)) {
      i = skip(A, i, last);
      continue;
    }
    if (i == last || is_op(A, i, "=")) {
      if (is_ident(A, start) && (start + 1 == i || is_op(A, start + 1, ":"))) {
        bind(A, start, k);
      } else {
        /* Tuple and list targets rebind their names; subscripts and
         * attributes (x[i] = ..., x.a = ...) bind nothing. */
        for (size_t x = start; x < i;) {
          if (is_open(A, x) && x > start &&
              (is_ident(A, x - 1) || is_close(A, x - 1) || A->t[x - 1].kind == BH_TOK_STRING)) {
            x = skip(A, x, i);
            continue;
          }
          if (is_ident(A, x) && !(x > start && is_op(A, x - 1, ".")) &&
              !(x + 1 < i && (is_op(A, x + 1, ".") || is_op(A, x + 1, "(") || is_op(A, x + 1, "["))))
            bind(A, x, K_UNKNOWN);
          x++;
        }
      }
      start = i + 1;
    }
    i++;
  }
}

static void bind_as(analyzer *A, size_t s, size_t e) {
  for (size_t i = s; i + 1 < e; i++)
    if (is_name(A, i, "as") && is_ident(A, i + 1)) bind(A, i + 1, K_UNKNOWN);
}

/* ---------------------------------------------------------- statements */

static void pop_frame(analyzer *A) {
  frame *f = top(A), *p = f - 1;
  if (f->kind == FR_IF) {
    if (!f->last_term) p->chain_all_term = 0;
    else if (f->chain_ok && f->cond_false_dyn) p->rest_gated = 1;
  }
  if (f->kind == FR_DEF) unbind_to(A, f->bind_base);
  A->nframes--;
}

static frame *enter(analyzer *A, int32_t indent) {
  while (A->nframes > 1 && top(A)->indent >= indent) pop_frame(A);
  return top(A);
}

static int push_frame(analyzer *A, frame f) {
  if (A->nframes == A->capframes) {
    size_t cap = A->capframes * 2;
    frame *nf = realloc(A->frames, cap * sizeof *nf);
    if (!nf) return A->err = -ENOMEM;
    A->frames = nf, A->capframes = cap;
  }
  A->frames[A->nframes++] = f;
  return 0;
}

static int cur_gated(const frame *f) { return f->gated || f->rest_gated; }

static void simple(analyzer *A, size_t s, size_t e, int32_t indent) {
  frame *F = enter(A, indent);
  int g = cur_gated(F);
  if (g) fill(A, s, e);
  else memset(A->gate + s, 0, e - s);
  mark_seq(A, s, e, g, 0);
  comps_prepass(A, s, e);
  scan(A, s, e);
  bind_assign(A, s, e);
  bind_as(A, s, e);
  F = top(A);
  F->last_term = is_name(A, s, "return") || is_name(A, s, "continue") || is_name(A, s, "break") ||
                 is_name(A, s, "raise");
  F->chain = 0;
}

/* Parameters of `def NAME(...)`, the group at open. */
static void bind_params(analyzer *A, size_t open, size_t e, size_t name, int in_loaded_model) {
  int role = teq(A, name, "load_models_gpu") ? 1 : teq(A, name, "unload_model_and_clones") ? 2 : 0;
  int init = teq(A, name, "__init__");
  size_t m = group_end(A, open, e), start = open + 1;
  int idx = 0;
  for (size_t i = open + 1;; i++) {
    if (i < m && is_open(A, i)) {
      i = skip(A, i, m) - 1;
      continue;
    }
    if (i < m && !is_op(A, i, ",")) continue;
    size_t p = start;
    while (p < i && (is_op(A, p, "*") || is_op(A, p, "**"))) p++;
    if (p < i && is_ident(A, p)) {
      int k = K_UNKNOWN;
      if (in_loaded_model && idx == 0) k = K_ENTRY;
      else if (in_loaded_model && (teq(A, p, "model") || (init && idx == 1))) k = K_PATCHER;
      else if (role == 1 && idx == 0) k = K_PATCHERS;
      else if (role == 2 && idx == 0) k = K_PATCHER;
      bind(A, p, k);
      idx++;
    }
    if (i >= m) break;
    start = i + 1;
  }
}

/* A compound statement's header [s, c) (c: its colon, or the line's end). */
static void header(analyzer *A, size_t s, size_t c, size_t b, int32_t indent) {
  frame *F = enter(A, indent);
  size_t k = s;
  if (is_name(A, k, "async") && k + 1 < c) k++;
  int g = cur_gated(F), cond_g = g, body_g = g, chain_ok = 0, cfd = 0;
  int kind = FR_OTHER;
  if (is_name(A, k, "if") || is_name(A, k, "elif")) {
    int ct = implies(A, k + 1, c, 1, 0), cf = implies(A, k + 1, c, 0, 0);
    kind = FR_IF;
    if (is_name(A, k, "if")) {
      F->chain = 1, F->chain_else_gated = (uint8_t)cf, F->chain_all_term = 1;
      chain_ok = 1;
    } else if (F->chain) {
      cond_g = g || F->chain_else_gated;
      chain_ok = F->chain_all_term;
      F->chain_else_gated |= (uint8_t)cf;
    }
    body_g = cond_g || ct;
    cfd = cf;
  } else if (is_name(A, k, "else")) {
    body_g = g || (F->chain && F->chain_else_gated);
    F->chain = 0;
  } else if (is_name(A, k, "while")) {
    body_g = g || implies(A, k + 1, c, 1, 0);
    F->chain = 0;
  } else if (is_name(A, k, "def")) {
    body_g = 0, kind = FR_DEF;
    F->chain = 0;
  } else if (is_name(A, k, "class")) {
    body_g = 0, kind = FR_CLASS;
    F->chain = 0;
  } else {
    F->chain = 0;
  }
  F->last_term = 0;
  int in_loaded_model = F->kind == FR_CLASS && F->loaded_model;
  size_t he = c < b ? c + 1 : b;
  if (cond_g) fill(A, s, he);
  else memset(A->gate + s, 0, he - s);
  mark_seq(A, s, c, cond_g, 0);
  comps_prepass(A, s, c);
  scan(A, s, c);
  bind_as(A, s, c);
  if (is_name(A, k, "for")) {
    size_t in = find_kw(A, k + 1, c, "in");
    if (in != NONE) bind_target(A, k + 1, in, iter_kind(A, in + 1, c), NONE, NONE);
  }
  frame nf = {.indent = indent, .kind = (uint8_t)kind, .gated = (uint8_t)body_g,
              .chain_ok = (uint8_t)chain_ok, .cond_false_dyn = (uint8_t)cfd,
              .bind_base = kind == FR_DEF ? A->nbinds : scope_base(A)};
  if (kind == FR_CLASS && k + 1 < c) nf.loaded_model = (uint8_t)is_name(A, k + 1, "LoadedModel");
  if (push_frame(A, nf) < 0) return;
  if (kind == FR_DEF && k + 2 < c && is_ident(A, k + 1) && is_op(A, k + 2, "("))
    bind_params(A, k + 2, c, k + 1, in_loaded_model);
}

static int is_compound(const analyzer *A, size_t i) {
  static const char *const kws[] = {"if", "elif", "else", "for", "while", "with", "try",
                                    "except", "finally", "def", "class", "async", NULL};
  if (A->t[i].kind != BH_TOK_NAME) return 0;
  for (int k = 0; kws[k]; k++)
    if (teq(A, i, kws[k])) return 1;
  return 0;
}

/* The colon ending a compound header at s (lambdas take their own). */
static size_t header_colon(const analyzer *A, size_t s, size_t b) {
  int lambdas = 0;
  for (size_t i = s + 1; i < b;) {
    if (is_open(A, i)) {
      i = skip(A, i, b);
      continue;
    }
    if (is_name(A, i, "lambda")) lambdas++;
    else if (is_op(A, i, ":")) {
      if (!lambdas) return i;
      lambdas--;
    }
    i++;
  }
  return b;
}

static void process_line(analyzer *A, size_t a, size_t b, int32_t indent) {
  match_line(A, a, b);
  size_t s = a;
  while (s < b && !A->err) {
    if (is_compound(A, s)) {
      size_t c = header_colon(A, s, b);
      header(A, s, c, b, indent);
      if (c >= b) break;
      s = c + 1;
      if (indent < MAX_COLUMN * 2) indent++; /* an inline body */
      continue;
    }
    size_t e = s;
    while (e < b) {
      if (is_open(A, e)) {
        e = skip(A, e, b);
        continue;
      }
      if (is_op(A, e, ";")) break;
      e++;
    }
    simple(A, s, e, indent);
    s = e + 1;
  }
}

/* -------------------------------------------------------------- verdict */

static int is_dunder(const char *s) {
  size_t n = strlen(s);
  return n > 4 && s[0] == '_' && s[1] == '_' && s[n - 1] == '_' && s[n - 2] == '_';
}

static int surface_has(const bh_canary_report *r, const char *name) {
  if (!baseline_find(name)) return 0;
  for (size_t i = 0; i < r->nwithout; i++)
    if (strcmp(r->without[i], name) == 0) return 0;
  return 1;
}

typedef struct {
  char *p;
  size_t n, cap;
  int err;
} sbuf;

static void sb_printf(sbuf *b, const char *fmt, ...) {
  if (b->err) return;
  for (;;) {
    va_list ap;
    va_start(ap, fmt);
    size_t room = b->cap - b->n;
    int w = vsnprintf(b->p ? b->p + b->n : NULL, room, fmt, ap);
    va_end(ap);
    if (w < 0) {
      b->err = -EINVAL;
      return;
    }
    if ((size_t)w < room) {
      b->n += (size_t)w;
      return;
    }
    size_t cap = (b->n + (size_t)w + 1) * 2;
    char *np = realloc(b->p, cap);
    if (!np) {
      b->err = -ENOMEM;
      return;
    }
    b->p = np, b->cap = cap;
  }
}

/* `name(_, _, kw=..., **...)` */
static void shape_text(sbuf *b, const char *name, const bh_canary_shape *sh) {
  const char *sep = "";
  sb_printf(b, "%s(", name);
  for (int i = 0; i < sh->positional; i++, sep = ", ") sb_printf(b, "%s_", sep);
  if (sh->star) sb_printf(b, "%s*...", sep), sep = ", ";
  const char *k = sh->keywords;
  while (k && *k) {
    const char *comma = strchr(k, ',');
    size_t len = comma ? (size_t)(comma - k) : strlen(k);
    sb_printf(b, "%s%.*s=...", sep, (int)len, k);
    sep = ", ";
    k += len + (comma ? 1 : 0);
  }
  if (sh->kwstar) sb_printf(b, "%s**...", sep);
  sb_printf(b, ")");
}

/* Why the StandIn's method refuses this shape, or NULL. */
static void shape_problem(sbuf *why, const baseline_t *bl, const bh_canary_shape *sh) {
  if (sh->star || sh->kwstar) {
    sb_printf(why, "passes *args or **kwargs, which the canary cannot check against the StandIn's %s",
              bl->signature);
    return;
  }
  if (sh->positional > bl->nparams) {
    sb_printf(why, "%d positional argument%s; the StandIn takes %s", sh->positional,
              sh->positional == 1 ? "" : "s", bl->signature);
    return;
  }
  int given[3] = {0};
  for (int i = 0; i < sh->positional; i++) given[i] = 1;
  const char *k = sh->keywords;
  while (k && *k) {
    const char *comma = strchr(k, ',');
    size_t len = comma ? (size_t)(comma - k) : strlen(k);
    int found = -1;
    for (int p = 0; p < bl->nparams; p++)
      if (strlen(bl->params[p].name) == len && memcmp(bl->params[p].name, k, len) == 0) found = p;
    if (found < 0 || (bl->params[found].flags & P_POSONLY)) {
      sb_printf(why, "keyword %.*s= is not accepted; the StandIn takes %s", (int)len, k, bl->signature);
      return;
    }
    if (given[found]) {
      sb_printf(why, "%.*s is given twice; the StandIn takes %s", (int)len, k, bl->signature);
      return;
    }
    given[found] = 1;
    k += len + (comma ? 1 : 0);
  }
  for (int p = 0; p < bl->nparams; p++)
    if ((bl->params[p].flags & P_REQUIRED) && !given[p]) {
      sb_printf(why, "argument %s is missing; the StandIn takes %s", bl->params[p].name, bl->signature);
      return;
    }
}

static int add_change(bh_canary_report *r, const char *name, int line, sbuf *shape, sbuf *why) {
  if (shape->err || why->err) return shape->err ? shape->err : why->err;
  bh_canary_change *nc = realloc(r->changes, (r->nchanges + 1) * sizeof *nc);
  if (!nc) return -ENOMEM;
  r->changes = nc;
  char *nm = strdup(name);
  if (!nm) return -ENOMEM;
  r->changes[r->nchanges++] = (bh_canary_change){.name = nm, .line = line, .shape = shape->p, .reason = why->p};
  *shape = (sbuf){0};
  *why = (sbuf){0};
  return 0;
}

/* The uses of an answered name that the StandIn would refuse. */
static int check_uses(bh_canary_report *r, const bh_canary_name *R) {
  const baseline_t *bl = baseline_find(R->name);
  int rc = 0;
  sbuf shape = {0}, why = {0};
  if (!bl) return 0;
  if (!bl->is_call && (R->uses & BH_CANARY_CALL)) {
    if (R->nshapes) shape_text(&shape, R->name, &R->shapes[0]);
    else sb_printf(&shape, "%s(...)", R->name);
    sb_printf(&why, "called, but the StandIn's %s", bl->signature);
    if ((rc = add_change(r, R->name, R->nshapes ? R->shapes[0].line : R->line, &shape, &why)) < 0)
      goto out;
  }
  if (bl->is_call && (R->uses & BH_CANARY_READ)) {
    sb_printf(&shape, "%s", R->name);
    sb_printf(&why, "read without a call, but the StandIn's is a method: %s", bl->signature);
    if ((rc = add_change(r, R->name, R->line, &shape, &why)) < 0) goto out;
  }
  if (R->uses & BH_CANARY_WRITE) {
    sb_printf(&shape, "%s = ...", R->name);
    sb_printf(&why, "assigned, but the StandIn's members are read-only");
    if ((rc = add_change(r, R->name, R->line, &shape, &why)) < 0) goto out;
  }
  for (size_t i = 0; bl->is_call && i < R->nshapes; i++) {
    shape_problem(&why, bl, &R->shapes[i]);
    if (!why.p && !why.err) continue;
    shape_text(&shape, R->name, &R->shapes[i]);
    if ((rc = add_change(r, R->name, R->shapes[i].line, &shape, &why)) < 0) goto out;
  }
out:
  free(shape.p);
  free(why.p);
  return rc;
}

static int change_order(const void *a, const void *b) {
  const bh_canary_change *x = a, *y = b;
  if (x->line != y->line) return (x->line > y->line) - (x->line < y->line);
  return strcmp(x->shape, y->shape);
}

static int verdict(bh_canary_report *r) {
  for (size_t i = 0; i < r->nnames; i++) {
    bh_canary_name *R = &r->names[i];
    unsigned real = R->uses & ~(unsigned)BH_CANARY_PROBE;
    R->in_surface = surface_has(r, R->name);
    if (!real && (R->gated_uses & ~(unsigned)BH_CANARY_PROBE)) R->cls = BH_CANARY_GATED, r->ngated++;
    else if (!real) R->cls = BH_CANARY_PROBED, r->nprobed++;
    else if (is_dunder(R->name)) {
      R->cls = BH_CANARY_NOT_MEMBER, r->nnot_members++;
      R->why = "every object has it (not a patcher member)";
    } else if (strcmp(R->name, "model") == 0 && R->in_surface) {
      R->cls = BH_CANARY_NOT_MEMBER, r->nnot_members++;
      R->why = "inner module: the patcher's torch module (the StandIn answers .model)";
    } else if (R->in_surface) R->cls = BH_CANARY_ANSWERED, r->nanswered++;
    else R->cls = BH_CANARY_LACKING, r->nlacking++;
    if (R->in_surface && real) {
      int rc = check_uses(r, R);
      if (rc < 0) return rc;
    }
  }
  for (size_t b = 0; b < NBASELINE; b++) {
    if (!surface_has(r, BASELINE[b].name)) continue;
    const bh_canary_name *R = bh_canary_report_find(r, BASELINE[b].name);
    if (!R || !(R->uses & ~(unsigned)BH_CANARY_PROBE)) r->unread[r->nunread++] = BASELINE[b].name;
  }
  if (r->nchanges > 1) qsort(r->changes, r->nchanges, sizeof *r->changes, change_order);
  return 0;
}

static void analyzer_free(analyzer *A) {
  free(A->match);
  free(A->gate);
  free(A->dyn);
  free(A->stack);
  free(A->binds);
  free(A->slots);
  free(A->frames);
  free(A->hash);
}

int bh_canary_analyze(const char *src, size_t len, const char *const *without, bh_canary_report **out) {
  if (!out || (!src && len)) return -EINVAL;
  *out = NULL;
  bh_canary_token *t = NULL;
  size_t nt = 0;
  analyzer A = {0};
  bh_canary_report *r = calloc(1, sizeof *r);
  int rc = -ENOMEM;
  if (!r) goto fail;
  for (size_t i = 0; without && without[i]; i++) {
    const baseline_t *bl = baseline_find(without[i]);
    rc = -EINVAL;
    if (!bl || r->nwithout >= sizeof r->without / sizeof r->without[0]) goto fail;
    r->without[r->nwithout++] = bl->name;
  }
  if ((rc = bh_canary_tokenize(src, len, &t, &nt)) < 0) goto fail;
  rc = -ENOMEM;
  A.src = src ? src : "", A.t = t, A.nt = nt;
  A.match = malloc(nt * sizeof *A.match);
  A.gate = calloc(nt, 1);
  A.dyn = malloc((nt + 1) * sizeof *A.dyn);
  A.stack = malloc(nt * sizeof *A.stack);
  A.capframes = 16;
  A.frames = malloc(A.capframes * sizeof *A.frames);
  if (!A.match || !A.gate || !A.dyn || !A.stack || !A.frames) goto fail;
  A.dyn[0] = 0;
  for (size_t i = 0; i < nt; i++) A.dyn[i + 1] = A.dyn[i] + is_name(&A, i, "is_dynamic");
  A.frames[0] = (frame){.indent = -1, .kind = FR_MODULE};
  A.nframes = 1;
  for (size_t i = 0; i < nt && t[i].kind != BH_TOK_END && !A.err;) {
    size_t a = i;
    while (i < nt && t[i].kind != BH_TOK_NEWLINE && t[i].kind != BH_TOK_END) i++;
    size_t b = i;
    if (i < nt && t[i].kind == BH_TOK_NEWLINE) i++;
    if (a < b) process_line(&A, a, b, t[a].indent < 0 ? 0 : t[a].indent);
  }
  while (A.nframes > 1) pop_frame(&A);
  r->names = A.names, r->nnames = A.nnames;
  A.names = NULL, A.nnames = 0;
  if ((rc = A.err) < 0) goto fail;
  if ((rc = verdict(r)) < 0) goto fail;
  analyzer_free(&A);
  free(t);
  *out = r;
  return 0;
fail:
  if (A.names) {
    for (size_t i = 0; i < A.nnames; i++) {
      for (size_t k = 0; k < A.names[i].nshapes; k++) free(A.names[i].shapes[k].keywords);
      free(A.names[i].shapes);
      free(A.names[i].name);
    }
    free(A.names);
  }
  analyzer_free(&A);
  free(t);
  bh_canary_report_free(r);
  return rc;
}

void bh_canary_report_free(bh_canary_report *r) {
  if (!r) return;
  for (size_t i = 0; i < r->nnames; i++) {
    for (size_t k = 0; k < r->names[i].nshapes; k++) free(r->names[i].shapes[k].keywords);
    free(r->names[i].shapes);
    free(r->names[i].name);
  }
  free(r->names);
  for (size_t i = 0; i < r->nchanges; i++) {
    free(r->changes[i].name);
    free(r->changes[i].shape);
    free(r->changes[i].reason);
  }
  free(r->changes);
  free(r);
}

const bh_canary_name *bh_canary_report_find(const bh_canary_report *r, const char *name) {
  if (!r || !name) return NULL;
  for (size_t i = 0; i < r->nnames; i++)
    if (strcmp(r->names[i].name, name) == 0) return &r->names[i];
  return NULL;
}

int bh_canary_report_status(const bh_canary_report *r) {
  return r && (r->nlacking > 0 || r->nchanges > 0) ? 1 : 0;
}

/* ---------------------------------------------------------------- output */

/* How a name is used, for a report line. */
static void uses_text(sbuf *b, const bh_canary_name *R, int gated) {
  unsigned u = gated ? R->gated_uses : R->uses;
  const char *sep = "";
  if (u & BH_CANARY_READ) sb_printf(b, "attribute"), sep = ", ";
  if (u & BH_CANARY_CALL) {
    if (gated || R->nshapes == 0) sb_printf(b, "%scall", sep);
    for (size_t i = 0; !gated && i < R->nshapes; i++) {
      sb_printf(b, "%s", sep);
      shape_text(b, R->name, &R->shapes[i]);
      sep = ", ";
    }
    sep = ", ";
  }
  if (u & BH_CANARY_WRITE) sb_printf(b, "%sassigned", sep), sep = ", ";
  if (u & BH_CANARY_PROBE) sb_printf(b, "%sprobed", sep);
}

static int by_line(const void *a, const void *b) {
  const bh_canary_name *x = *(const bh_canary_name *const *)a, *y = *(const bh_canary_name *const *)b;
  int lx = x->line ? x->line : x->gated_line, ly = y->line ? y->line : y->gated_line;
  return (lx > ly) - (lx < ly);
}

/* The names of one class, by first use. */
static const bh_canary_name **section(const bh_canary_report *r, enum bh_canary_class cls, size_t *n) {
  const bh_canary_name **v = malloc((r->nnames + 1) * sizeof *v);
  *n = 0;
  if (!v) return NULL;
  for (size_t i = 0; i < r->nnames; i++)
    if (r->names[i].cls == cls) v[(*n)++] = &r->names[i];
  qsort(v, *n, sizeof *v, by_line);
  return v;
}

static void json_str(FILE *f, const char *s) {
  fputc('"', f);
  for (; *s; s++) {
    unsigned char c = (unsigned char)*s;
    if (c == '"' || c == '\\') fprintf(f, "\\%c", c);
    else if (c < 0x20 || c >= 0x7f) fprintf(f, "\\u%04x", c);
    else fputc(c, f);
  }
  fputc('"', f);
}

static void json_uses(FILE *f, unsigned u) {
  static const char *const names[] = {"attribute", "call", "write", "probe"};
  const char *sep = "";
  fputc('[', f);
  for (int i = 0; i < 4; i++)
    if (u & (1u << i)) {
      fprintf(f, "%s\"%s\"", sep, names[i]);
      sep = ", ";
    }
  fputc(']', f);
}

static const char *const CLASS_KEYS[] = {"answered", "lacking", "gated", "not_members", "probed"};

static int write_json(const bh_canary_report *r, const char *path, FILE *f) {
  int rc = 0;
  fprintf(f, "{\n  \"file\": ");
  json_str(f, path);
  fprintf(f, ",\n  \"ok\": %s,\n  \"status\": %d,\n  \"surface\": [",
          bh_canary_report_status(r) ? "false" : "true", bh_canary_report_status(r));
  const char *sep = "";
  for (size_t b = 0; b < NBASELINE; b++)
    if (surface_has(r, BASELINE[b].name)) fprintf(f, "%s\"%s\"", sep, BASELINE[b].name), sep = ", ";
  fprintf(f, "],\n  \"without\": [");
  sep = "";
  for (size_t i = 0; i < r->nwithout; i++) fprintf(f, "%s\"%s\"", sep, r->without[i]), sep = ", ";
  fprintf(f, "]");
  for (int cls = 0; cls < 5; cls++) {
    size_t n;
    const bh_canary_name **v = section(r, (enum bh_canary_class)cls, &n);
    if (!v) return -ENOMEM;
    fprintf(f, ",\n  \"%s\": [", CLASS_KEYS[cls]);
    for (size_t i = 0; i < n; i++) {
      const bh_canary_name *R = v[i];
      int gated = cls == BH_CANARY_GATED;
      fprintf(f, "%s\n    {\"name\": ", i ? "," : "");
      json_str(f, R->name);
      fprintf(f, ", \"line\": %d, \"uses\": ", gated ? R->gated_line : R->line);
      json_uses(f, gated ? R->gated_uses : R->uses);
      fprintf(f, ", \"answered\": %s", R->in_surface ? "true" : "false");
      if (R->why) {
        fprintf(f, ", \"why\": ");
        json_str(f, R->why);
      }
      if (!gated && R->nshapes) {
        fprintf(f, ", \"calls\": [");
        for (size_t k = 0; k < R->nshapes; k++) {
          sbuf b = {0};
          shape_text(&b, R->name, &R->shapes[k]);
          if (b.err) rc = b.err;
          fprintf(f, "%s", k ? ", " : "");
          json_str(f, b.p ? b.p : "");
          free(b.p);
        }
        fprintf(f, "]");
      }
      fprintf(f, "}");
    }
    fprintf(f, "%s]", n ? "\n  " : "");
    free(v);
  }
  fprintf(f, ",\n  \"changed\": [");
  for (size_t i = 0; i < r->nchanges; i++) {
    fprintf(f, "%s\n    {\"name\": ", i ? "," : "");
    json_str(f, r->changes[i].name);
    fprintf(f, ", \"line\": %d, \"call\": ", r->changes[i].line);
    json_str(f, r->changes[i].shape);
    fprintf(f, ", \"reason\": ");
    json_str(f, r->changes[i].reason);
    fprintf(f, "}");
  }
  fprintf(f, "%s],\n  \"unread\": [", r->nchanges ? "\n  " : "");
  for (size_t i = 0; i < r->nunread; i++) fprintf(f, "%s\"%s\"", i ? ", " : "", r->unread[i]);
  fprintf(f, "]\n}\n");
  return rc;
}

static void text_line(FILE *f, const char *name, const char *what, const char *path, int line) {
  fprintf(f, "  %-28s %-44s %s:%d\n", name, what, path, line);
}

static int write_text(const bh_canary_report *r, const char *path, FILE *f) {
  static const char *const titles[] = {
      "answered by the StandIn", "lacking (the StandIn does not answer them)",
      "gated behind is_dynamic() (never reached: the StandIn answers False)",
      "not members (subtracted)", "probed only (hasattr / getattr with a default: a miss is no error)"};
  size_t nsurface = NBASELINE - r->nwithout, nmembers = r->nanswered + r->nlacking;
  fprintf(f, "bulkhead canary: %s\n", path);
  fprintf(f, "upstream reads %zu member%s off a ledger entry's patcher (the StandIn answers %zu",
          nmembers, nmembers == 1 ? "" : "s", nsurface);
  if (r->nwithout) {
    fprintf(f, "; left out with --without:");
    for (size_t i = 0; i < r->nwithout; i++) fprintf(f, " %s", r->without[i]);
  }
  fprintf(f, ")\n");
  for (int cls = 0; cls < 5; cls++) {
    size_t n;
    const bh_canary_name **v = section(r, (enum bh_canary_class)cls, &n);
    if (!v) return -ENOMEM;
    if (cls == BH_CANARY_PROBED && n == 0) {
      free(v);
      continue;
    }
    fprintf(f, "\n%s (%zu)%s\n", titles[cls], n, n ? ":" : "");
    for (size_t i = 0; i < n; i++) {
      const bh_canary_name *R = v[i];
      int gated = cls == BH_CANARY_GATED;
      sbuf b = {0};
      if (R->why) sb_printf(&b, "%s", R->why);
      else uses_text(&b, R, gated);
      if (gated) sb_printf(&b, R->in_surface ? "; answered" : "; not answered");
      if (b.err) {
        free(b.p);
        free(v);
        return b.err;
      }
      text_line(f, R->name, b.p ? b.p : "", path, gated ? R->gated_line : R->line);
      free(b.p);
    }
    if (cls == BH_CANARY_LACKING) {
      /* Call shapes right after what is missing: both fail the check. */
      fprintf(f, "\nchanged call shapes (%zu)%s\n", r->nchanges, r->nchanges ? ":" : "");
      for (size_t i = 0; i < r->nchanges; i++) {
        text_line(f, r->changes[i].name, r->changes[i].shape, path, r->changes[i].line);
        fprintf(f, "      %s\n", r->changes[i].reason);
      }
    }
    free(v);
  }
  fprintf(f, "\nStandIn members upstream does not read (%zu)%s", r->nunread, r->nunread ? ":" : "");
  for (size_t i = 0; i < r->nunread; i++) fprintf(f, " %s", r->unread[i]);
  fprintf(f, "\n\n");
  if (!bh_canary_report_status(r)) {
    fprintf(f, "OK: the StandIn answers every member upstream reads, in every call shape.\n");
    return 0;
  }
  fprintf(f, "FAIL:");
  if (r->nlacking) {
    fprintf(f, " the StandIn lacks");
    for (size_t i = 0; i < r->nnames; i++)
      if (r->names[i].cls == BH_CANARY_LACKING) fprintf(f, " %s", r->names[i].name);
    fprintf(f, "%s", r->nchanges ? ";" : "");
  }
  if (r->nchanges) {
    fprintf(f, " call shapes changed:");
    for (size_t i = 0; i < r->nchanges; i++) fprintf(f, " %s", r->changes[i].shape);
  }
  fprintf(f, "\n");
  return 0;
}

int bh_canary_report_write(const bh_canary_report *r, const char *path, int json, FILE *f) {
  if (!r || !path || !f) return -EINVAL;
  int rc = json ? write_json(r, path, f) : write_text(r, path, f);
  if (rc < 0) return rc;
  if (fflush(f) != 0 || ferror(f)) return -EIO;
  return 0;
}

/* ------------------------------------------------------------------ main */

/* Reads the whole file; *buf is malloc'ed (the caller frees it). */
static int read_file(const char *path, char **buf, size_t *len) {
  int fd = -1, rc = 0;
  char *p = NULL;
  size_t n = 0, cap = 0;
  struct stat st;
  *buf = NULL, *len = 0;
  fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    rc = -errno;
    goto out;
  }
  if (fstat(fd, &st) < 0) {
    rc = -errno;
    goto out;
  }
  if (S_ISDIR(st.st_mode)) {
    rc = -EISDIR;
    goto out;
  }
  for (;;) {
    if (n == cap) {
      if (cap > BH_CANARY_MAX_SOURCE) {
        rc = -EFBIG;
        goto out;
      }
      cap = cap ? cap * 2 : 128 * 1024;
      char *np = realloc(p, cap + 1);
      if (!np) {
        rc = -ENOMEM;
        goto out;
      }
      p = np;
    }
    ssize_t got = read(fd, p + n, cap - n);
    if (got < 0) {
      if (errno == EINTR) continue;
      rc = -errno;
      goto out;
    }
    if (got == 0) break;
    n += (size_t)got;
  }
  if (n > BH_CANARY_MAX_SOURCE) {
    rc = -EFBIG;
    goto out;
  }
  *buf = p, *len = n, p = NULL;
out:
  free(p);
  if (fd >= 0) close(fd);
  return rc;
}

static int usage(FILE *f, int status, const char *why) {
  if (why) fprintf(f, "bulkhead canary: %s\n", why);
  fprintf(f,
          "usage: bulkhead canary [--json] [--without NAME]... COMFYUI_DIR\n"
          "\n"
          "Reads COMFYUI_DIR/comfy/model_management.py (or COMFYUI_DIR itself when it is\n"
          "that file), derives the members ComfyUI's memory manager reads off a ledger\n"
          "entry's patcher, and checks them against what bulkhead's StandIn answers.\n"
          "\n"
          "  --json          one JSON object instead of the report\n"
          "  --without NAME  check against the StandIn without member NAME (repeatable):\n"
          "                  what would fail if it were dropped\n"
          "\n"
          "Exit: 0 the StandIn covers everything, 1 it lacks a member or a call shape\n"
          "changed (listed), 2 the file cannot be read or a usage error.\n");
  return status;
}

int bh_canary_main(int argc, char **argv) {
  const char *without[33] = {0};
  size_t nwithout = 0;
  const char *dir = NULL;
  int json = 0, rest = 0, status = 2;
  char *path = NULL, *src = NULL;
  size_t len = 0;
  bh_canary_report *r = NULL;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *w = NULL;
    if (!rest && strcmp(a, "--") == 0) {
      rest = 1;
      continue;
    }
    if (!rest && (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0)) return usage(stdout, 0, NULL);
    if (!rest && strcmp(a, "--json") == 0) {
      json = 1;
      continue;
    }
    if (!rest && strcmp(a, "--without") == 0) {
      if (++i >= argc) return usage(stderr, 2, "--without needs a member name");
      w = argv[i];
    } else if (!rest && strncmp(a, "--without=", 10) == 0) {
      w = a + 10;
    } else if (!rest && a[0] == '-' && a[1]) {
      fprintf(stderr, "bulkhead canary: unknown option %s\n", a);
      return usage(stderr, 2, NULL);
    } else {
      if (dir) return usage(stderr, 2, "one COMFYUI_DIR only");
      dir = a;
      continue;
    }
    if (!baseline_find(w)) {
      fprintf(stderr, "bulkhead canary: --without %s: the StandIn has no member of that name\n", w);
      return usage(stderr, 2, NULL);
    }
    if (nwithout >= 32) return usage(stderr, 2, "too many --without");
    without[nwithout++] = w;
  }
  if (!dir || !*dir) return usage(stderr, 2, "which ComfyUI checkout? (COMFYUI_DIR)");

  struct stat st;
  if (stat(dir, &st) == 0 && !S_ISDIR(st.st_mode)) {
    path = strdup(dir);
  } else {
    size_t n = strlen(dir);
    const char *slash = dir[n - 1] == '/' ? "" : "/";
    if (asprintf(&path, "%s%scomfy/model_management.py", dir, slash) < 0) path = NULL;
  }
  if (!path) {
    fprintf(stderr, "bulkhead canary: out of memory\n");
    goto out;
  }
  int rc = read_file(path, &src, &len);
  if (rc < 0) {
    fprintf(stderr, "bulkhead canary: cannot read %s: %s (errno %d)\n", path,
            rc == -EFBIG ? "larger than the canary reads (4 MiB)" : strerror(-rc), -rc);
    if (json) {
      printf("{\"file\": ");
      json_str(stdout, path);
      printf(", \"ok\": false, \"status\": 2, \"errno\": %d, \"error\": ", -rc);
      json_str(stdout, strerror(-rc));
      printf("}\n");
    }
    goto out;
  }
  rc = bh_canary_analyze(src, len, without, &r);
  if (rc < 0) {
    fprintf(stderr, "bulkhead canary: %s: %s\n", path, strerror(-rc));
    goto out;
  }
  rc = bh_canary_report_write(r, path, json, stdout);
  if (rc < 0) {
    fprintf(stderr, "bulkhead canary: writing the report: %s\n", strerror(-rc));
    goto out;
  }
  status = bh_canary_report_status(r);
out:
  bh_canary_report_free(r);
  free(src);
  free(path);
  return status;
}
