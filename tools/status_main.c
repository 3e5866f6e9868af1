/*
 * status_main.c -- the `bulkhead status` verb: options, one snapshot, the
 * table or the JSON document on stdout.  The snapshot and both renderings
 * are the status library's (src/status/status.c), which the extension
 * also links, so ComfyUI's GET /bulkhead/status serves the very same
 * document.
 */
#include "cli.h"

#include <getopt.h>
#include <stdio.h>
#include <sys/ioctl.h>
#include <unistd.h>

int bh_cli_status_main(int argc, char **argv) {
  enum { O_LEDGER = 256, O_JSON };
  static const struct option longs[] = {{"help", no_argument, NULL, 'h'},
                                        {"json", no_argument, NULL, O_JSON},
                                        {"ledger", required_argument, NULL, O_LEDGER},
                                        {NULL, 0, NULL, 0}};
  const char *ledger = NULL;
  int json = 0, c, rc, code = BH_CLI_EXIT_OK;
  bh_status_probes probes;
  bh_status_snap snap;
  bh_buf out;
  opterr = 0;
  while ((c = getopt_long(argc, argv, ":h", longs, NULL)) != -1) {
    if (c == 'h') return bh_cli_usage(stdout, "status", BH_CLI_EXIT_OK);
    if (c == '?') return bh_cli_usage_error("status", "unknown option '%s'", argv[optind - 1]);
    if (c == ':') return bh_cli_usage_error("status", "option '%s' needs a value", argv[optind - 1]);
    if (c == O_JSON) json = 1;
    if (c == O_LEDGER) ledger = optarg;
  }
  if (optind < argc) return bh_cli_usage_error("status", "unexpected argument '%s'", argv[optind]);
  if (ledger && !ledger[0]) return bh_cli_usage_error("status", "--ledger needs a path");
  bh_buf_init(&out);
  bh_status_probes_open(&probes);
  rc = bh_status_snap_take(&snap, ledger, NULL, &probes);
  if (rc < 0) {
    fprintf(stderr, "bulkhead status: cannot read the ledger %s: %s\n", snap.ledger_path, bh_strerror(rc));
    code = BH_CLI_EXIT_LEDGER;
    goto out;
  }
  unsigned cols = 80;
  struct winsize ws;
  if (isatty(STDOUT_FILENO) && ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col >= 40)
    cols = ws.ws_col;
  rc = json ? bh_status_json(&out, &snap) : bh_status_text(&out, &snap, cols);
  if (rc == 0) rc = bh_cli_write_all(STDOUT_FILENO, out.data, out.len);
  if (rc < 0) {
    fprintf(stderr, "bulkhead status: %s\n", bh_strerror(rc));
    code = BH_CLI_EXIT_LEDGER;
  }
out:
  bh_status_snap_free(&snap);
  bh_status_probes_close(&probes);
  bh_buf_free(&out);
  return code;
}
