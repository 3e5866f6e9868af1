/*
 * fuzz.h -- what every libFuzzer target in fuzz/ includes.
 *
 * Each target is one LLVMFuzzerTestOneInput over the core sources, built
 * by fuzz/Makefile with clang -fsanitize=fuzzer,address,undefined and
 * -DFUZZING_BUILD_MODE_UNSAFE_FOR_PRODUCTION (see internal.h for the two
 * things that define changes in the ledger).  A target checks the
 * decoder's contract on every input with FUZZ_CHECK: a broken promise
 * aborts, and libFuzzer saves the input as a crash, the same as an
 * over-read caught by ASan or undefined behaviour caught by UBSan.
 */
#ifndef BH_FUZZ_H
#define BH_FUZZ_H

#include "bulkhead/bulkhead.h"

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

#define FUZZ_CHECK(expr)                                                        \
  do {                                                                          \
    if (!(expr)) {                                                              \
      fprintf(stderr, "%s:%d: contract broken: %s\n", __FILE__, __LINE__, #expr); \
      abort();                                                                  \
    }                                                                           \
  } while (0)

/* A return code that must be one of a list (BH_E* values, negated). */
static inline int fuzz_rc_in(int rc, const int *ok, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (rc == ok[i]) return 1;
  fprintf(stderr, "unexpected return code %d (%s)\n", rc, bh_strerror(rc));
  return 0;
}
#define FUZZ_RC_IN(rc, ...)                                                     \
  FUZZ_CHECK(fuzz_rc_in((rc), (const int[]){__VA_ARGS__},                      \
                        sizeof((const int[]){__VA_ARGS__}) / sizeof(int)))

/* Reads every byte of [p, p+n) so ASan sees a span that reaches outside
 * its buffer; the result only keeps the compiler from dropping the loop. */
static inline unsigned fuzz_touch(const void *p, size_t n) {
  const volatile uint8_t *q = p;
  unsigned acc = 0;
  for (size_t i = 0; i < n; i++) acc += q[i];
  return acc;
}

#endif
