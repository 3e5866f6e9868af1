/*
 * canary_main.c -- the standalone `bulkhead-canary` executable: the same
 * command as `bulkhead canary` (tools/canary.c), until the `bulkhead`
 * command's main dispatches to bh_canary_main itself.
 */
#include "canary.h"

int main(int argc, char **argv) {
  char name[] = "canary";
  if (argc > 0) argv[0] = name;
  return bh_canary_main(argc, argv);
}
