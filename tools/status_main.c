/*
 * status_main.c -- the `bulkhead status` verb: options, one snapshot, the
 * table or the JSON document on stdout.  The snapshot and both renderings
 * are the status library's (src/status/status.c), which the extension
 * also links, so ComfyUI's GET /bulkhead/status serves the very same
 * document; then, asked of each host's control socket, where each pack it
 * serves stands ("packs": isolated, in-process with why and the fix, or
 * failed), which the ledger cannot say.
 */
#include "cli.h"

#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <unistd.h>

/* Where each pack of each live host stands: its control socket's `packs`
 * (host/control.py), asked with a short deadline; a host without a
 * control socket (a script, a test) or one that does not answer in time
 * has none listed.  The ledger alone cannot say: a pack that runs in
 * ComfyUI's process, or failed, has no record of its own. */
#define BH__PACKS_MAX 256
#define BH__PACKS_TIMEOUT_S 1.0

typedef struct bh__host_packs {
  pid_t host;
  int n;
  bh_cli_pack rows[BH__PACKS_MAX];
} bh__host_packs;

static int bh__read_packs(const uint8_t *p, size_t n, int is_error, void *ctx) {
  bh__host_packs *h = ctx;
  if (is_error) return 0; /* an older host: no `packs` call; none listed */
  return bh_cli_packs_read(p, n, h->rows, BH__PACKS_MAX, &h->n);
}

/* Asks every host record of the snapshot; returns how many answered
 * (*out: calloc'd, one per host record). */
static int bh__packs_of_hosts(const bh_status_snap *snap, bh__host_packs **out) {
  int hosts = 0, k = 0;
  for (int i = 0; i < snap->n_records; i++) hosts += snap->records[i].role == BH_ROLE_HOST;
  *out = hosts ? calloc((size_t)hosts, sizeof **out) : NULL;
  if (!*out) return 0;
  bh_buf none;
  bh_buf_init(&none);
  bh_enc_tuple(&none, 0);
  for (int i = 0; i < snap->n_records; i++) {
    if (snap->records[i].role != BH_ROLE_HOST) continue;
    bh__host_packs *h = &(*out)[k];
    h->host = snap->records[i].pid;
    if (bh_cli_host_call("status", h->host, "packs", &none, BH__PACKS_TIMEOUT_S, 1, bh__read_packs, h) ==
            BH_CLI_EXIT_OK && h->n > 0)
      k++;
    else
      memset(h, 0, sizeof *h);
  }
  bh_buf_free(&none);
  return k;
}

/* The packs section of the table: one line per pack, those not isolated
 * with why and the fix under it, then its newest build's log file and the
 * command that does what the panel's button offers (a Retry, a Build; an
 * isolated pack too where its update's rebuild failed), wrapped as the
 * table's device reasons are (bh_status_wrapped: shown whole, a fix's
 * command and a path included), every name and message through
 * bh_text_fit first, as every name in the table is (control characters
 * and invalid UTF-8 as '?': a pack's name or message never moves the
 * cursor). */
static void bh__packs_text(bh_buf *b, const bh__host_packs *hp, int n, unsigned cols) {
  char name[4 * 28 + 1], text[4 * (sizeof hp->rows[0].command + 64) + 1];
  char run[sizeof hp->rows[0].command + sizeof hp->rows[0].actions + 32], first[sizeof hp->rows[0].actions];
  for (int i = 0; i < n; i++) {
    const bh__host_packs *h = &hp[i];
    bh_text_appendf(b, "\npacks of host %d:\n", (int)h->host);
    for (int j = 0; j < h->n; j++) {
      const bh_cli_pack *p = &h->rows[j];
      size_t start = b->len;
      int iso = strcmp(p->state, "isolated") == 0;
      bh_text_fit(name, sizeof name, p->name, 28, 1);
      bh_text_appendf(b, "  %s %s", name, iso ? "isolated" : strcmp(p->state, "failed") == 0
                                              ? "FAILED" : "NOT isolated (in ComfyUI's process)");
      if (iso && p->pid > 0) bh_text_appendf(b, ", worker pid %lld", (long long)p->pid);
      if (iso && p->sandbox[0]) {
        bh_text_fit(text, sizeof text, p->sandbox, (unsigned)sizeof p->sandbox, 0);
        bh_text_appendf(b, ", %s", text);
      }
      bh_text_line_clip(b, start, cols);
      bh_text_appendf(b, "\n");
      const char *lines[2] = {p->reason, p->fix};
      const char *labels[2] = {"    why:", "    fix:"};
      for (int l = 0; l < 2 && !iso; l++) {
        if (!lines[l][0]) continue;
        bh_text_fit(text, sizeof text, lines[l], (unsigned)sizeof p->reason, 0);
        bh_status_wrapped(b, labels[l], text, cols);
      }
      if (iso && strncmp(p->actions, "retry", 5) != 0) continue;
      if (p->log[0]) {
        bh_text_fit(text, sizeof text, p->log, (unsigned)sizeof p->log, 0);
        bh_status_wrapped(b, "    log:", text, cols);
      }
      if (p->command[0] && p->actions[0]) {
        /* the first action offered, as its button says it: "Retry" */
        size_t k = strcspn(p->actions, ",");
        memcpy(first, p->actions, k);
        first[k] = 0;
        if (first[0] >= 'a' && first[0] <= 'z') first[0] = (char)(first[0] - 'a' + 'A');
        snprintf(run, sizeof run, "%s (or the panel's %s)", p->command, first);
        bh_text_fit(text, sizeof text, run, (unsigned)sizeof run, 0);
        bh_status_wrapped(b, "    run:", text, cols);
      }
    }
  }
}

/* The packs as one more top-level member of the JSON document (one line,
 * newline-terminated: its closing brace gives way), when a host told its
 * packs: without, the document is the status library's alone, as GET
 * /bulkhead/status and _native.status_json make it. */
static void bh__packs_json(bh_buf *b, const bh__host_packs *hp, int n) {
  if (n == 0 || b->len < 2 || b->data[b->len - 2] != '}' || b->data[b->len - 1] != '\n') return;
  b->len -= 2;
  bh_text_appendf(b, ",\"packs\":[");
  int first = 1;
  for (int i = 0; i < n; i++)
    for (int j = 0; j < hp[i].n; j++) {
      const bh_cli_pack *p = &hp[i].rows[j];
      bh_text_appendf(b, "%s{\"host_pid\":%d", first ? "" : ",", (int)hp[i].host);
      for (int f = 0; f < BH_CLI_PACK_STRS; f++) {
        const char *v = (const char *)p + bh_cli_pack_strs[f].offset;
        bh_text_appendf(b, ",\"%s\":", bh_cli_pack_strs[f].key);
        bh_text_json_str(b, v, strlen(v));
      }
      if (p->pid > 0) bh_text_appendf(b, ",\"pid\":%lld}", (long long)p->pid);
      else bh_text_appendf(b, ",\"pid\":null}");
      first = 0;
    }
  bh_text_appendf(b, "]}\n");
}

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
  if (rc == 0) {
    bh__host_packs *packs = NULL;
    int n = bh__packs_of_hosts(&snap, &packs);
    if (json) bh__packs_json(&out, packs, n);
    else bh__packs_text(&out, packs, n, cols);
    free(packs);
    rc = out.err;
  }
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
