/*
 * text.c -- the status library's pure text helpers: byte sizes and idle
 * times printed ("512.0 MiB", "5m03s"), printf-style appending, JSON
 * string literals, and text made safe and narrow enough for a terminal.
 * The status renderings (status.c) use them, and so does the `bulkhead`
 * command (tools/) for its own output.
 *
 * Nothing here does I/O or reads a clock, so tests/c/test-cli.c drives
 * every function with tables.  Untrusted text passes through: pack names,
 * model names and device names come from any process of this user that
 * joined the ledger, so JSON output escapes everything a parser could
 * choke on (and replaces bytes that are not UTF-8: a JSON document must be
 * valid Unicode), and terminal output replaces every control character
 * (C0, DEL and C1: ESC or 0x9b in a pack name must not move the cursor or
 * retitle the window).
 */
#include "status.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

/* ------------------------------------------------------------ sizes */

int bh_text_bytes_format(uint64_t n, char *buf, size_t len) {
  static const char *const units[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  int w;
  if (!buf || len == 0) return 0;
  if (n < 1024) {
    w = snprintf(buf, len, "%u B", (unsigned)n);
  } else {
    int u = 0;
    long double v = (long double)n / 1024.0L;
    while (v >= 1024.0L && u < 5) {
      v /= 1024.0L;
      u++;
    }
    w = snprintf(buf, len, "%.1Lf %s", v, units[u]);
  }
  if (w < 0) w = 0;
  return (size_t)w >= len ? (int)len - 1 : w;
}

/* ------------------------------------------------------------ times */

int bh_text_idle_format(int64_t ns, char *buf, size_t len) {
  int w;
  if (!buf || len == 0) return 0;
  if (ns < 0) {
    w = snprintf(buf, len, "-");
  } else {
    long long s = (long long)(ns / 1000000000);
    if (s < 60) w = snprintf(buf, len, "%llds", s);
    else if (s < 3600) w = snprintf(buf, len, "%lldm%02llds", s / 60, s % 60);
    else if (s < 86400) w = snprintf(buf, len, "%lldh%02lldm", s / 3600, s % 3600 / 60);
    else w = snprintf(buf, len, "%lldd%02lldh", s / 86400, s % 86400 / 3600);
  }
  if (w < 0) w = 0;
  return (size_t)w >= len ? (int)len - 1 : w;
}

/* ------------------------------------------------------------- text */

int bh_text_appendf(bh_buf *b, const char *fmt, ...) {
  va_list ap;
  if (b->err) return b->err;
  for (int round = 0; round < 2; round++) {
    size_t room = b->cap - b->len;
    va_start(ap, fmt);
    int n = vsnprintf(room ? (char *)b->data + b->len : NULL, room, fmt, ap);
    va_end(ap);
    if (n < 0) return b->err = -EINVAL;
    if ((size_t)n < room) {
      b->len += (size_t)n;
      return 0;
    }
    if (bh_buf_reserve(b, (size_t)n + 1) < 0) return b->err;
  }
  return b->err = -EINVAL; /* the text changed between two formattings: can't happen */
}

static int bh__append(bh_buf *b, const void *p, size_t n) {
  if (bh_buf_reserve(b, n) < 0) return b->err;
  memcpy(b->data + b->len, p, n);
  b->len += n;
  return 0;
}

/* Length of the valid UTF-8 sequence at p (RFC 3629: no overlongs, no
 * surrogates, nothing past U+10FFFF), or 0 when it is not one. */
static size_t bh__utf8_len(const unsigned char *p, size_t n) {
  unsigned c = p[0];
  size_t need;
  unsigned lo = 0x80, hi = 0xbf;
  if (c < 0x80) return 1;
  if (c >= 0xc2 && c <= 0xdf) need = 1;
  else if (c >= 0xe0 && c <= 0xef) {
    need = 2;
    if (c == 0xe0) lo = 0xa0;
    if (c == 0xed) hi = 0x9f;
  } else if (c >= 0xf0 && c <= 0xf4) {
    need = 3;
    if (c == 0xf0) lo = 0x90;
    if (c == 0xf4) hi = 0x8f;
  } else {
    return 0;
  }
  if (n < need + 1) return 0;
  if (p[1] < lo || p[1] > hi) return 0;
  for (size_t i = 2; i <= need; i++)
    if (p[i] < 0x80 || p[i] > 0xbf) return 0;
  return need + 1;
}

int bh_text_json_str(bh_buf *b, const char *s, size_t n) {
  static const char hex[] = "0123456789abcdef";
  const unsigned char *p = (const unsigned char *)s;
  size_t i = 0;
  bh__append(b, "\"", 1);
  while (i < n) {
    unsigned c = p[i];
    char esc[8];
    if (c < 0x20 || c == 0x7f || c == '"' || c == '\\') {
      const char *e = c == '"' ? "\\\"" : c == '\\' ? "\\\\" : c == '\n' ? "\\n"
                    : c == '\r' ? "\\r" : c == '\t' ? "\\t" : c == '\b' ? "\\b"
                    : c == '\f' ? "\\f" : NULL;
      if (!e) {
        memcpy(esc, "\\u00", 4);
        esc[4] = hex[c >> 4];
        esc[5] = hex[c & 15];
        esc[6] = 0;
        e = esc;
      }
      bh__append(b, e, strlen(e));
      i++;
      continue;
    }
    size_t k = bh__utf8_len(p + i, n - i);
    if (k == 0) {
      bh__append(b, "\\ufffd", 6);
      i++;
    } else {
      bh__append(b, p + i, k);
      i += k;
    }
  }
  return bh__append(b, "\"", 1);
}

/* One character of a terminal text at p: its byte length in *adv and
 * whether it is shown as is (0: replace it by '?'). */
static int bh__term_char(const unsigned char *p, size_t n, size_t *adv) {
  size_t k = bh__utf8_len(p, n);
  if (k == 0) {
    *adv = 1;
    return 0;
  }
  *adv = k;
  if (k == 1) return p[0] >= 0x20 && p[0] != 0x7f;
  if (k == 2 && p[0] == 0xc2 && p[1] < 0xa0) return 0; /* C1 controls, U+0080..U+009F */
  return 1;
}

int bh_text_fit(char *dst, size_t dstlen, const char *src, unsigned cols, int pad) {
  const unsigned char *p = (const unsigned char *)(src ? src : "");
  size_t n = strlen((const char *)p), i = 0, o = 0, adv;
  unsigned total = 0, shown = 0;
  if (!dst || dstlen == 0) return 0;
  for (i = 0; i < n; i += adv, total++) bh__term_char(p + i, n - i, &adv);
  unsigned keep = total > cols ? (cols ? cols - 1 : 0) : total;
  for (i = 0; shown < keep; i += adv, shown++) {
    int ok = bh__term_char(p + i, n - i, &adv);
    size_t w = ok ? adv : 1;
    if (o + w + 1 > dstlen) break;
    if (ok) memcpy(dst + o, p + i, adv);
    else dst[o] = '?';
    o += w;
  }
  if (total > cols && cols > 0 && o + 2 <= dstlen) {
    dst[o++] = '~';
    shown++;
  }
  while (pad && shown < cols && o + 2 <= dstlen) {
    dst[o++] = ' ';
    shown++;
  }
  dst[o] = 0;
  return (int)shown;
}

unsigned bh_text_line_clip(bh_buf *b, size_t start, unsigned cols) {
  const unsigned char *p = b->data;
  size_t i = start;
  unsigned shown = 0;
  while (i < b->len) {
    if (p[i] == 0x1b) { /* ESC [ params final, or ESC + one byte */
      i++;
      if (i < b->len && p[i] == '[') {
        for (i++; i < b->len && !(p[i] >= 0x40 && p[i] <= 0x7e); i++) {
        }
      }
      if (i < b->len) i++;
      continue;
    }
    if ((p[i] & 0xc0) == 0x80) { /* a continuation byte: same character */
      i++;
      continue;
    }
    if (shown == cols) {
      b->len = i;
      break;
    }
    shown++;
    i++;
  }
  return shown;
}

