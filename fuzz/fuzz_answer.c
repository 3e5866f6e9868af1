/*
 * fuzz_answer.c -- the readers of a host's answers to `bulkhead release`
 * (bh_cli_answer_read) and `bulkhead status` (bh_cli_packs_read,
 * tools/text.c) on arbitrary bytes.
 *
 * The answer is the value of a RESULT or ERROR frame from a host's control
 * socket: bytes another process chose.  Checked on every input: the reader
 * returns 0 or a negative BH_E* code (0 only when the whole input is one
 * valid value, a map); the strings it fills stay NUL-terminated inside
 * their fields; fields the value did not name keep what the caller set.
 */
#include "fuzz.h"
#include "cli.h"

#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  bh_cli_answer a;
  memset(&a, 0x5a, sizeof a);
  a.pack[0] = a.type[0] = a.message[0] = 0;
  a.pack[sizeof a.pack - 1] = a.type[sizeof a.type - 1] = a.message[sizeof a.message - 1] = 0;
  int64_t unset;
  memset(&unset, 0x5a, sizeof unset);
  int rc = bh_cli_answer_read(data, size, &a);
  FUZZ_CHECK(rc <= 0);
  if (rc == 0) FUZZ_CHECK(bh_dec_validate(data, size, BH_MAX_DEPTH) == 0);
  FUZZ_CHECK(memchr(a.pack, 0, sizeof a.pack) != NULL);
  FUZZ_CHECK(memchr(a.type, 0, sizeof a.type) != NULL);
  FUZZ_CHECK(memchr(a.message, 0, sizeof a.message) != NULL);
  if (rc < 0 && bh_dec_validate(data, size, BH_MAX_DEPTH) < 0)
    FUZZ_CHECK(a.worker_pid == unset && a.freed_bytes == unset); /* nothing taken from a bad value */
  bh_cli_pack rows[4];
  int n = -1;
  rc = bh_cli_packs_read(data, size, rows, 4, &n);
  FUZZ_CHECK(rc <= 0 && n >= 0 && n <= 4);
  if (rc == 0) FUZZ_CHECK(bh_dec_validate(data, size, BH_MAX_DEPTH) == 0);
  for (int i = 0; i < n; i++)
    FUZZ_CHECK(memchr(rows[i].name, 0, sizeof rows[i].name) && memchr(rows[i].state, 0, sizeof rows[i].state) &&
               memchr(rows[i].reason, 0, sizeof rows[i].reason) && memchr(rows[i].fix, 0, sizeof rows[i].fix));
  return 0;
}
