/*
 * test-cli.c -- the `bulkhead` command's pure helpers (tools/text.c, and
 * the status library's src/status/text.c):
 * byte sizes both ways, seconds and idle times, JSON string literals for
 * names with quotes, control characters and broken UTF-8, text made safe
 * and narrow for a terminal, and a host's answer to `release` decoded.  Each is a table; the command itself is
 * driven end to end by tests/py/test_cli.py.
 */
#include "task.h"

#include "cli.h"

TEST_IMPL(cli_bytes_parse) {
  static const struct {
    const char *in;
    int rc;
    uint64_t v;
  } rows[] = {
      {"0", 0, 0},
      {"1", 0, 1},
      {"1000000", 0, 1000000},
      {"512B", 0, 512},
      {"1K", 0, 1024},
      {"1k", 0, 1024},
      {"1KiB", 0, 1024},
      {"1kib", 0, 1024},
      {"1KB", 0, 1000},
      {"512M", 0, 512ull << 20},
      {"512 MiB", 0, 512ull << 20},
      {"3MB", 0, 3000000},
      {"1G", 0, 1ull << 30},
      {"1.5G", 0, 3ull << 29},
      {"1.5GiB", 0, 3ull << 29},
      {".5K", 0, 512},
      {"0.1K", 0, 102}, /* fractions truncate to whole bytes */
      {"2T", 0, 2ull << 40},
      {"1P", 0, 1ull << 50},
      {"2GB", 0, 2000000000ull},
      {"18446744073709551615", 0, UINT64_MAX},
      {"18446744073709551616", -ERANGE, 0},
      {"16384P", -ERANGE, 0},
      {"99999999999999999999K", -ERANGE, 0},
      {"", -EINVAL, 0},
      {"K", -EINVAL, 0},
      {".", -EINVAL, 0},
      {"-1", -EINVAL, 0},
      {"+1", -EINVAL, 0},
      {"1.5", -EINVAL, 0},  /* a fraction of a byte */
      {"1.5B", -EINVAL, 0},
      {"1X", -EINVAL, 0},
      {"1 M B", -EINVAL, 0},
      {"1MiBs", -EINVAL, 0},
      {"0x10", -EINVAL, 0},
      {"1e3", -EINVAL, 0},
      {" 1", -EINVAL, 0},
  };
  for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
    uint64_t v = 12345;
    int rc = bh_cli_bytes_parse(rows[i].in, &v);
    if (rc != rows[i].rc || (rc == 0 && v != rows[i].v))
      FAIL("'%s': rc %d value %" PRIu64 ", want rc %d value %" PRIu64, rows[i].in, rc, v, rows[i].rc,
           rows[i].v);
    if (rc < 0) ASSERT_UEQ(v, 12345); /* untouched on failure */
  }
  ASSERT_RC(bh_cli_bytes_parse(NULL, NULL), -EINVAL);
  return 0;
}

TEST_IMPL(cli_bytes_format) {
  static const struct {
    uint64_t n;
    const char *out;
  } rows[] = {
      {0, "0 B"},
      {1, "1 B"},
      {1023, "1023 B"},
      {1024, "1.0 KiB"},
      {1536, "1.5 KiB"},
      {512ull << 20, "512.0 MiB"},
      {(1ull << 30) - 1, "1024.0 MiB"}, /* rounds up, never past 10 characters */
      {1ull << 30, "1.0 GiB"},
      {150000000000ull, "139.7 GiB"},
      {3ull << 40, "3.0 TiB"},
      {UINT64_MAX, "16.0 EiB"},
  };
  char buf[32];
  for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
    int n = bh_text_bytes_format(rows[i].n, buf, sizeof buf);
    ASSERT_STR_EQ(buf, rows[i].out);
    ASSERT_EQ(n, (int)strlen(rows[i].out));
    ASSERT_LE(n, 10);
  }
  /* Truncated to the buffer, still terminated. */
  ASSERT_EQ(bh_text_bytes_format(512ull << 20, buf, 4), 3);
  ASSERT_STR_EQ(buf, "512");
  return 0;
}

TEST_IMPL(cli_seconds_and_idle) {
  double v = -1;
  ASSERT_OK(bh_cli_seconds_parse("0.5", 0.1, 10, &v));
  ASSERT(v == 0.5);
  ASSERT_OK(bh_cli_seconds_parse("10", 0.1, 10, &v));
  ASSERT(v == 10);
  const char *bad[] = {"", "0.05", "11", "abc", "1s", "nan", "inf", "-1", "1 "};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
    if (bh_cli_seconds_parse(bad[i], 0.1, 10, &v) != -EINVAL) FAIL("'%s' was accepted", bad[i]);

  static const struct {
    int64_t ns;
    const char *out;
  } rows[] = {
      {-1, "-"},
      {0, "0s"},
      {999999999, "0s"},
      {59000000000ll, "59s"},
      {60000000000ll, "1m00s"},
      {303000000000ll, "5m03s"},
      {3600000000000ll, "1h00m"},
      {7500000000000ll, "2h05m"},
      {86400000000000ll, "1d00h"},
      {(3 * 86400 + 4 * 3600) * 1000000000ll, "3d04h"},
  };
  char buf[16];
  for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
    bh_text_idle_format(rows[i].ns, buf, sizeof buf);
    ASSERT_STR_EQ(buf, rows[i].out);
  }
  return 0;
}

/* The JSON literal bh_text_json_str makes of n bytes. */
static const char *json_of(const char *s, size_t n, bh_buf *b) {
  b->len = 0;
  ASSERT_OK(bh_text_json_str(b, s, n));
  ASSERT_OK(bh_buf_reserve(b, 1));
  b->data[b->len] = 0;
  return (const char *)b->data;
}

TEST_IMPL(cli_json_escaping) {
  bh_buf b;
  bh_buf_init(&b);
  static const struct {
    const char *in;
    size_t n;
    const char *out;
  } rows[] = {
      {"pack-a", 6, "\"pack-a\""},
      {"", 0, "\"\""},
      {"say \"hi\"", 8, "\"say \\\"hi\\\"\""},
      {"a\\b", 3, "\"a\\\\b\""},
      {"\n\r\t\b\f", 5, "\"\\n\\r\\t\\b\\f\""},
      {"\x01\x1b[31m\x7f", 7, "\"\\u0001\\u001b[31m\\u007f\""},
      {"nul\0byte", 8, "\"nul\\u0000byte\""},
      {"caf\xc3\xa9", 5, "\"caf\xc3\xa9\""},                 /* valid UTF-8 passes */
      {"\xe2\x82\xac\xf0\x9f\x98\x80", 7, "\"\xe2\x82\xac\xf0\x9f\x98\x80\""},
      {"\xc2\x9b", 2, "\"\xc2\x9b\""},                       /* C1 is valid JSON */
      {"bad\xff", 4, "\"bad\\ufffd\""},                      /* not UTF-8 */
      {"\xc3", 1, "\"\\ufffd\""},                            /* truncated */
      {"\xc0\xaf", 2, "\"\\ufffd\\ufffd\""},                 /* overlong '/' */
      {"\xed\xa0\x80", 3, "\"\\ufffd\\ufffd\\ufffd\""},      /* a surrogate */
      {"\xf4\x90\x80\x80", 4, "\"\\ufffd\\ufffd\\ufffd\\ufffd\""}, /* past U+10FFFF */
      {"\xe2\x82", 2, "\"\\ufffd\\ufffd\""},
  };
  for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++)
    ASSERT_STR_EQ(json_of(rows[i].in, rows[i].n, &b), rows[i].out);
  /* Every byte value, alone: always a valid JSON literal (no raw control
   * or non-ASCII byte left unescaped except in valid UTF-8). */
  for (int c = 0; c < 256; c++) {
    char one = (char)c;
    const char *j = json_of(&one, 1, &b);
    size_t n = strlen(j);
    ASSERT(j[0] == '"' && j[n - 1] == '"');
    for (size_t k = 0; k < n; k++) ASSERT((unsigned char)j[k] >= 0x20 && (unsigned char)j[k] < 0x7f);
  }
  bh_buf_free(&b);
  return 0;
}

TEST_IMPL(cli_text_fit) {
  char out[128];
  static const struct {
    const char *in;
    unsigned cols;
    int pad;
    const char *out;
    int shown;
  } rows[] = {
      {"pack-a", 10, 0, "pack-a", 6},
      {"pack-a", 10, 1, "pack-a    ", 10},
      {"pack-a", 6, 0, "pack-a", 6},
      {"pack-ab", 6, 0, "pack-~", 6},
      {"pack-ab", 1, 0, "~", 1},
      {"pack-ab", 0, 0, "", 0},
      {"", 3, 1, "   ", 3},
      {"a\x1b[2Jb", 10, 0, "a?[2Jb", 6},         /* ESC never reaches the terminal */
      {"a\nb\tc\x7f", 10, 0, "a?b?c?", 6},
      {"a\xc2\x9b" "2J", 10, 0, "a?2J", 4},      /* C1 CSI (U+009B) too */
      {"caf\xc3\xa9", 10, 0, "caf\xc3\xa9", 4},  /* UTF-8 counts characters */
      {"\xc3\xa9\xc3\xa9\xc3\xa9", 2, 0, "\xc3\xa9~", 2},
      {"x\xff" "y", 10, 0, "x?y", 3},            /* broken UTF-8 */
  };
  for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
    int shown = bh_text_fit(out, sizeof out, rows[i].in, rows[i].cols, rows[i].pad);
    ASSERT_STR_EQ(out, rows[i].out);
    ASSERT_EQ(shown, rows[i].shown);
  }
  ASSERT_EQ(bh_text_fit(out, sizeof out, NULL, 3, 0), 0);
  ASSERT_STR_EQ(out, "");
  /* A small destination cuts sooner, never overflows. */
  bh_text_fit(out, 4, "abcdefgh", 8, 0);
  ASSERT_STR_EQ(out, "abc");
  return 0;
}

TEST_IMPL(cli_line_clip_and_bar) {
  bh_buf b;
  bh_buf_init(&b);
  ASSERT_OK(bh_text_appendf(&b, "head\n"));
  size_t start = b.len;
  ASSERT_OK(bh_text_appendf(&b, "\033[1mabc\033[0m d\xc3\xa9" "fgh"));
  ASSERT_EQ(bh_text_line_clip(&b, start, 6), 6);
  ASSERT_EQ(b.len - start, strlen("\033[1mabc\033[0m d\xc3\xa9"));
  ASSERT_EQ(bh_text_line_clip(&b, start, 80), 6); /* short enough: unchanged */
  ASSERT_OK(bh_text_appendf(&b, "%s", "")); /* appendf of nothing is fine */
  bh_buf_free(&b);

  char bar[16];
  bh_cli_bar(bar, 0, 100, 10);
  ASSERT_STR_EQ(bar, "..........");
  bh_cli_bar(bar, 1, 1000, 10); /* something held shows */
  ASSERT_STR_EQ(bar, "|.........");
  bh_cli_bar(bar, 50, 100, 10);
  ASSERT_STR_EQ(bar, "|||||.....");
  bh_cli_bar(bar, 200, 100, 10); /* clamped */
  ASSERT_STR_EQ(bar, "||||||||||");
  bh_cli_bar(bar, 5, 0, 4);
  ASSERT_STR_EQ(bar, "....");
  bh_cli_bar(bar, 5, 10, 0);
  ASSERT_STR_EQ(bar, "");
  return 0;
}

TEST_IMPL(cli_appendf_grows) {
  bh_buf b;
  bh_buf_init(&b);
  for (int i = 0; i < 1000; i++) ASSERT_OK(bh_text_appendf(&b, "%04d,", i));
  ASSERT_EQ(b.len, 5000);
  ASSERT_MEM_EQ(b.data + 4995, "0999,", 5);
  char big[10000];
  memset(big, 'x', sizeof big - 1);
  big[sizeof big - 1] = 0;
  ASSERT_OK(bh_text_appendf(&b, "%s", big));
  ASSERT_EQ(b.len, 5000 + sizeof big - 1);
  bh_buf_free(&b);
  return 0;
}

/* A host's answer to `packs`: the rows taken, what is not a row skipped,
 * strings clipped, anything cut refused. */
TEST_IMPL(cli_packs_read) {
  bh_buf b;
  bh_cli_pack rows[2];
  int n = -1;
  char reason[900];
  memset(reason, 'r', sizeof reason);
  bh_buf_init(&b);
  bh_enc_list(&b, 4);
  bh_enc_map(&b, 6);
  bh_enc_str(&b, "name", 4), bh_enc_str(&b, "good", 4);
  bh_enc_str(&b, "state", 5), bh_enc_str(&b, "isolated", 8);
  bh_enc_str(&b, "pid", 3), bh_enc_int(&b, 77);
  bh_enc_str(&b, "log", 3), bh_enc_str(&b, "/h/logs/good/1.log", 18);
  bh_enc_str(&b, "actions", 7), bh_enc_str(&b, "retry, rebuild", 14);
  bh_enc_str(&b, "command", 7), bh_enc_str(&b, "bulkhead install /p/good", 24);
  bh_enc_int(&b, 5); /* not a row */
  bh_enc_map(&b, 4);
  bh_enc_str(&b, "name", 4), bh_enc_str(&b, "lost", 4);
  bh_enc_str(&b, "state", 5), bh_enc_str(&b, "in-process", 10);
  bh_enc_str(&b, "reason", 6), bh_enc_str(&b, reason, sizeof reason);
  bh_enc_str(&b, "pid", 3), bh_enc_nil(&b);
  bh_enc_map(&b, 1); /* past max: skipped */
  bh_enc_str(&b, "name", 4), bh_enc_str(&b, "third", 5);
  ASSERT_EQ(b.err, 0);
  ASSERT_OK(bh_cli_packs_read(b.data, b.len, rows, 2, &n));
  ASSERT_EQ(n, 2);
  ASSERT_STR_EQ(rows[0].name, "good");
  ASSERT_STR_EQ(rows[0].state, "isolated");
  ASSERT_EQ(rows[0].pid, 77);
  ASSERT_STR_EQ(rows[0].log, "/h/logs/good/1.log");
  ASSERT_STR_EQ(rows[0].actions, "retry, rebuild");
  ASSERT_STR_EQ(rows[0].command, "bulkhead install /p/good");
  ASSERT_STR_EQ(rows[1].name, "lost");
  ASSERT_EQ(rows[1].pid, -1);
  ASSERT_EQ(strlen(rows[1].reason), sizeof rows[1].reason - 1);
  ASSERT_STR_EQ(rows[1].fix, "");
  ASSERT_STR_EQ(rows[1].log, "");
  for (size_t cut = 0; cut < b.len; cut++) ASSERT(bh_cli_packs_read(b.data, cut, rows, 2, &n) < 0);
  bh_buf_free(&b);
  bh_buf_init(&b);
  bh_enc_map(&b, 0);
  ASSERT_RC(bh_cli_packs_read(b.data, b.len, rows, 2, &n), -BH_EBADTAG);
  bh_buf_free(&b);
  return 0;
}

/* A host's answer to `release`: the fields taken, the rest left alone. */
TEST_IMPL(cli_answer_read) {
  bh_buf b;
  bh_cli_answer a;
  /* A receipt, with a key the reader does not know (skipped, nested). */
  bh_buf_init(&b);
  bh_enc_map(&b, 4);
  bh_enc_str(&b, "worker_pid", 10), bh_enc_int(&b, 4242);
  bh_enc_str(&b, "extra", 5), bh_enc_list(&b, 1), bh_enc_map(&b, 1);
  bh_enc_str(&b, "freed_bytes", 11), bh_enc_int(&b, 1);
  bh_enc_str(&b, "pack", 4), bh_enc_str(&b, "packa", 5);
  bh_enc_str(&b, "freed_bytes", 11), bh_enc_int(&b, 1048576);
  ASSERT_EQ(b.err, 0);
  memset(&a, 0, sizeof a);
  a.before_bytes = -7;
  ASSERT_OK(bh_cli_answer_read(b.data, b.len, &a));
  ASSERT_EQ(a.worker_pid, 4242);
  ASSERT_EQ(a.freed_bytes, 1048576); /* not the nested one */
  ASSERT_STR_EQ(a.pack, "packa");
  ASSERT_EQ(a.before_bytes, -7); /* absent: as the caller set it */
  /* Cut anywhere, it is refused before anything is taken. */
  for (size_t n = 0; n < b.len; n++) {
    memset(&a, 0, sizeof a);
    ASSERT(bh_cli_answer_read(b.data, n, &a) < 0);
    ASSERT_EQ(a.worker_pid, 0);
  }
  bh_buf_free(&b);
  /* A message longer than its field is clipped and terminated; keys of the
   * wrong type are ignored. */
  char msg[3000];
  memset(msg, 'm', sizeof msg);
  bh_buf_init(&b);
  bh_enc_map(&b, 3);
  bh_enc_str(&b, "message", 7), bh_enc_str(&b, msg, sizeof msg);
  bh_enc_str(&b, "worker_pid", 10), bh_enc_str(&b, "12", 2);
  bh_enc_int(&b, 5), bh_enc_str(&b, "type", 4);
  ASSERT_EQ(b.err, 0);
  memset(&a, 0, sizeof a);
  ASSERT_OK(bh_cli_answer_read(b.data, b.len, &a));
  ASSERT_EQ(strlen(a.message), sizeof a.message - 1);
  ASSERT_EQ(a.worker_pid, 0);
  ASSERT_STR_EQ(a.type, "");
  bh_buf_free(&b);
  /* Not a map. */
  bh_buf_init(&b);
  bh_enc_list(&b, 0);
  ASSERT_RC(bh_cli_answer_read(b.data, b.len, &a), -BH_EBADTAG);
  bh_buf_free(&b);
  return 0;
}
