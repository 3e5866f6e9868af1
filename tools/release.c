/*
 * release.c -- `bulkhead release PID|PACK [--bytes N]`: asks a worker,
 * through its host, to give memory back, and prints what it held before
 * and after.
 *
 * Only a host holds its workers' channels, so the command finds the worker
 * in the ledger (by pid, or by pack name: a pack with several workers is
 * an error that lists their pids), takes its host from the record
 * (host_pid) and talks to that host's control socket, served by
 * python/bulkhead/host/control.py:
 *
 *   path   $XDG_RUNTIME_DIR/bulkhead/host-<pid>.sock when XDG_RUNTIME_DIR
 *          is a private directory of ours, else
 *          /tmp/bulkhead-<uid>-<pid>-<random>/host-<pid>.sock (the host
 *          may have seen another environment than ours, so the other
 *          places are tried when the first is missing: bh__control_paths)
 *   socket SOCK_SEQPACKET, the frames of a worker channel (bh_channel with
 *          peer_uid = our uid and peer_pid = the host's pid: a frame from
 *          anyone else is rejected)
 *   ask    CALL, request id 1, payload ("release", (worker_pid,) or
 *          (worker_pid, nbytes), {}) -- the worker is named by pid even
 *          when the user gave a pack, since the ledger already resolved it
 *   answer RESULT {"worker_pid", "pack", "before_bytes", "after_bytes",
 *          "freed_bytes"}, or ERROR {"type", "message", "traceback"}
 *
 * Exit codes: 0 released; 1 no such worker (or an ambiguous pack); 2
 * usage; 3 the host cannot be reached (no socket, refused, closed, or no
 * answer within --timeout); 4 the host answered with an error (its
 * message printed); 5 the ledger cannot be read.
 */
#include "cli.h"

#include <errno.h>
#include <inttypes.h>
#include <fcntl.h>
#include <getopt.h>
#include <glob.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

/* ------------------------------------------------------ finding it */

/* "pack-a (pid 12, host 10), ..." for error messages. */
static void bh__list_workers(const bh_status_snap *s, char *out, size_t len) {
  size_t o = 0;
  int shown = 0;
  out[0] = 0;
  for (int i = 0; i < s->n_records && o + 1 < len; i++) {
    const bh_ledger_record *r = &s->records[i];
    char pack[4 * 32 + 1];
    if (r->role != BH_ROLE_WORKER) continue;
    if (shown == 12) {
      snprintf(out + o, len - o, ", ...");
      return;
    }
    bh_text_fit(pack, sizeof pack, r->pack, 32, 0);
    int n = snprintf(out + o, len - o, "%s%s (pid %d, host %d)", shown ? ", " : "", pack, (int)r->pid,
                     (int)r->host_pid);
    if (n < 0) break;
    o += (size_t)n;
    shown++;
  }
  if (!shown) snprintf(out, len, "none");
}

static int bh__is_pid(const char *t, pid_t *pid) {
  char *end = NULL;
  if (!t[0] || strspn(t, "0123456789") != strlen(t)) return 0;
  errno = 0;
  long v = strtol(t, &end, 10);
  if (errno || v <= 0 || v > 0x7fffffffL) return 0;
  *pid = (pid_t)v;
  return 1;
}

/* Finds the one worker `target` names.  Returns its record index, or -1
 * after printing why (the exit code in *code). */
static int bh__find(const bh_status_snap *s, const char *target, int *code) {
  char list[1024], shown[4 * 64 + 1];
  pid_t pid;
  int found = -1, matches = 0;
  *code = BH_CLI_EXIT_NOTFOUND;
  bh_text_fit(shown, sizeof shown, target, 64, 0);
  if (!s->ledger_present) {
    fprintf(stderr, "bulkhead release: no worker '%s': no bulkhead processes (no ledger at %s)\n", shown,
            s->ledger_path);
    return -1;
  }
  bh__list_workers(s, list, sizeof list);
  if (bh__is_pid(target, &pid)) {
    for (int i = 0; i < s->n_records; i++)
      if (s->records[i].pid == pid) found = i;
    if (found < 0) {
      fprintf(stderr, "bulkhead release: no bulkhead process with pid %d in %s; workers: %s\n", (int)pid,
              s->ledger_path, list);
      return -1;
    }
    if (s->records[found].role != BH_ROLE_WORKER) {
      fprintf(stderr, "bulkhead release: pid %d is a %s, not a worker; workers: %s\n", (int)pid,
              bh_status_role_name(s->records[found].role), list);
      return -1;
    }
    return found;
  }
  char pids[512];
  size_t o = 0;
  pids[0] = 0;
  for (int i = 0; i < s->n_records; i++) {
    const bh_ledger_record *r = &s->records[i];
    if (r->role != BH_ROLE_WORKER || strcmp(r->pack, target) != 0) continue;
    found = i;
    matches++;
    int n = snprintf(pids + o, sizeof pids - o, "%s%d", o ? ", " : "", (int)r->pid);
    if (n > 0 && (size_t)n < sizeof pids - o) o += (size_t)n;
  }
  if (matches == 0) {
    fprintf(stderr, "bulkhead release: no worker of pack '%s' in %s; workers: %s\n", shown, s->ledger_path,
            list);
    return -1;
  }
  if (matches > 1) {
    fprintf(stderr, "bulkhead release: pack '%s' has %d workers (pids %s): name one by pid\n", shown, matches,
            pids);
    return -1;
  }
  return found;
}

/* ------------------------------------------------------- the socket */

/* Every place a host's control socket may be, in control.py's order
 * (rundir.runtime_dirs): $XDG_RUNTIME_DIR/bulkhead first when that is a
 * private directory of ours, then the host's own /tmp directories
 * (/tmp/bulkhead-<uid>-<pid>-*, each one that passes bh_private_dir: a
 * name another user made is never tried), then /tmp/bulkhead-<uid> where
 * an older bulkhead put them, and the XDG one last when it is not private.
 * Returns how many were written. */
#define BH__PATHS_MAX 8
typedef char bh__sock_path[sizeof(((struct sockaddr_un *)0)->sun_path)];

static void bh__add_path(bh__sock_path *paths, int *n, const char *dir, pid_t host) {
  char p[PATH_MAX + 64];
  int len = snprintf(p, sizeof p, "%s/host-%d.sock", dir, (int)host);
  if (*n >= BH__PATHS_MAX || len < 0 || (size_t)len >= sizeof paths[0]) return; /* too long to bind: the host could not either */
  memcpy(paths[(*n)++], p, (size_t)len + 1);
}

static int bh__control_paths(pid_t host, bh__sock_path *paths) {
  const char *run = getenv("XDG_RUNTIME_DIR");
  char xdg[PATH_MAX + 16], pat[96], legacy[64];
  int have_xdg = run && run[0] == '/' && strlen(run) < PATH_MAX;
  int xdg_first = have_xdg && bh_private_dir(run, 0) == 0;
  int n = 0;
  glob_t g;
  if (have_xdg) snprintf(xdg, sizeof xdg, "%s/bulkhead", run);
  if (xdg_first) bh__add_path(paths, &n, xdg, host);
  snprintf(pat, sizeof pat, "/tmp/bulkhead-%u-%d-*", (unsigned)getuid(), (int)host);
  if (glob(pat, 0, NULL, &g) == 0) {
    /* A pack's private TMPDIR (host/sandbox.py: <prefix>sandbox-...)
     * matches too; it holds no socket.  mkdtemp's part has no '-'. */
    size_t skip = strlen(pat) - 1;
    for (size_t i = 0; i < g.gl_pathc; i++)
      if (strncmp(g.gl_pathv[i] + skip, "sandbox-", 8) != 0 && bh_private_dir(g.gl_pathv[i], 0) == 0)
        bh__add_path(paths, &n, g.gl_pathv[i], host);
    globfree(&g);
  }
  snprintf(legacy, sizeof legacy, "/tmp/bulkhead-%u", (unsigned)getuid());
  bh__add_path(paths, &n, legacy, host);
  if (have_xdg && !xdg_first) bh__add_path(paths, &n, xdg, host);
  return n;
}

/* Connects to a SOCK_SEQPACKET socket at path before deadline_ns.
 * Returns the fd (close-on-exec, blocking) or -errno. */
static int bh__connect(const char *path, int64_t deadline_ns) {
  struct sockaddr_un sa;
  int fd = -1, rc;
  memset(&sa, 0, sizeof sa);
  sa.sun_family = AF_UNIX;
  if (strlen(path) >= sizeof sa.sun_path) return -ENAMETOOLONG;
  strcpy(sa.sun_path, path);
  fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return -errno;
  /* A host busy with another client leaves us in its backlog; a full
   * backlog answers EAGAIN, so wait for room until the deadline. */
  while ((rc = connect(fd, (struct sockaddr *)&sa, sizeof sa)) < 0 && errno == EAGAIN &&
         bh_now_ns() < deadline_ns) {
    struct timespec ts = {0, 20 * 1000 * 1000};
    nanosleep(&ts, NULL);
  }
  if (rc < 0 || fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK) < 0) {
    rc = -errno;
    close(fd);
    return rc;
  }
  return fd;
}

int bh_cli_host_call(const char *verb, pid_t host, const char *target, const bh_buf *args, double timeout_s,
                     int quiet, int (*read)(const uint8_t *p, size_t n, int is_error, void *ctx), void *ctx) {
  bh__sock_path paths[BH__PATHS_MAX];
  bh_channel *c = NULL;
  bh_buf req;
  int fd = -1, rc, code = BH_CLI_EXIT_UNREACHABLE, used = 0;
  int64_t deadline = bh_now_ns() + (int64_t)(timeout_s * 1e9);
  FILE *err = quiet ? NULL : stderr;
#define BH__SAY(...) (err ? (void)fprintf(err, __VA_ARGS__) : (void)0)
  bh_buf_init(&req);
  int n = bh__control_paths(host, paths);
  if (n == 0) {
    BH__SAY("bulkhead %s: host %d: its control socket's path is too long for a socket\n", verb, (int)host);
    goto out;
  }
  int errs[BH__PATHS_MAX] = {0};
  for (used = 0; used < n; used++) {
    fd = bh__connect(paths[used], deadline);
    if (fd >= 0) break;
    errs[used] = fd;
    if (fd != -ENOENT && fd != -ECONNREFUSED) break; /* it is there but broken: say so */
  }
  if (fd < 0) {
    BH__SAY("bulkhead %s: host %d is unreachable: %s: %s", verb, (int)host, paths[0], bh_strerror(errs[0]));
    for (int i = 1; i < n && errs[i]; i++) BH__SAY(" (and %s: %s)", paths[i], bh_strerror(errs[i]));
    BH__SAY("\n");
    goto out;
  }
  bh_channel_opts o = {.peer_uid = getuid(), .peer_pid = host, .spin_ns = -1};
  rc = bh_channel_open(&c, fd, &o); /* consumes fd */
  fd = -1;
  if (rc < 0) {
    BH__SAY("bulkhead %s: %s: %s\n", verb, paths[used], bh_strerror(rc));
    goto out;
  }
  bh_enc_tuple(&req, 3);
  bh_enc_str(&req, target, strlen(target));
  if (!req.err && (rc = bh_buf_reserve(&req, args->len)) == 0) {
    memcpy(req.data + req.len, args->data, args->len);
    req.len += args->len;
  } else if (!req.err) {
    req.err = rc;
  }
  bh_enc_map(&req, 0);
  if (req.err || args->err) {
    rc = req.err ? req.err : args->err;
    BH__SAY("bulkhead %s: %s\n", verb, bh_strerror(rc));
    goto out;
  }
  bh_msg m = {.kind = BH_KIND_CALL, .request_id = 1, .value = req.data, .value_len = req.len};
  rc = bh_channel_send(c, &m);
  if (rc < 0) {
    BH__SAY("bulkhead %s: host %d is unreachable: sending to %s: %s\n", verb, (int)host, paths[used],
            bh_strerror(rc));
    goto out;
  }
  for (;;) {
    bh_frame f;
    rc = bh_channel_recv(c, &f, deadline);
    if (rc == -EINTR) continue;
    if (rc == -ETIMEDOUT) {
      BH__SAY("bulkhead %s: host %d did not answer within %g s (%s)\n", verb, (int)host, timeout_s, paths[used]);
      goto out;
    }
    if (rc < 0) {
      BH__SAY("bulkhead %s: host %d: %s (%s)\n", verb, (int)host, bh_strerror(rc), paths[used]);
      goto out;
    }
    if ((f.h.kind == BH_KIND_RESULT || f.h.kind == BH_KIND_ERROR) && f.h.request_id == 1) {
      int is_error = f.h.kind == BH_KIND_ERROR;
      rc = read(f.value, f.value_len, is_error, ctx);
      bh_channel_frame_done(c, &f);
      if (rc < 0) {
        BH__SAY("bulkhead %s: host %d sent a malformed answer: %s\n", verb, (int)host, bh_strerror(rc));
        goto out;
      }
      code = is_error ? BH_CLI_EXIT_REFUSED : BH_CLI_EXIT_OK;
      break;
    }
    bh_channel_frame_done(c, &f); /* anything else is not for us */
  }
#undef BH__SAY
out:
  bh_buf_free(&req);
  bh_channel_close(c);
  return code;
}

/* release's answer: the receipt (or the host's error) into the caller's
 * bh_cli_answer, and whether it was an error. */
typedef struct bh__release_ctx {
  bh_cli_answer *a;
  int *is_error;
} bh__release_ctx;

static int bh__read_release(const uint8_t *p, size_t n, int is_error, void *ctx) {
  bh__release_ctx *c = ctx;
  *c->is_error = is_error;
  return bh_cli_answer_read(p, n, c->a);
}

/* Asks the host; fills *a.  Returns an exit code (messages printed). */
static int bh__ask(pid_t host, pid_t worker, int with_bytes, uint64_t nbytes, double timeout_s,
                   bh_cli_answer *a, int *is_error) {
  bh_buf args;
  bh_buf_init(&args);
  bh_enc_tuple(&args, with_bytes ? 2 : 1);
  bh_enc_int(&args, worker);
  if (with_bytes) bh_enc_int(&args, (int64_t)nbytes);
  bh__release_ctx ctx = {a, is_error};
  int code = bh_cli_host_call("release", host, "release", &args, timeout_s, 0, bh__read_release, &ctx);
  bh_buf_free(&args);
  return code;
}

/* ------------------------------------------------------------- verb */

int bh_cli_release_main(int argc, char **argv) {
  enum { O_LEDGER = 256, O_BYTES, O_TIMEOUT, O_JSON };
  static const struct option longs[] = {{"help", no_argument, NULL, 'h'},
                                        {"bytes", required_argument, NULL, O_BYTES},
                                        {"ledger", required_argument, NULL, O_LEDGER},
                                        {"timeout", required_argument, NULL, O_TIMEOUT},
                                        {"json", no_argument, NULL, O_JSON},
                                        {NULL, 0, NULL, 0}};
  const char *ledger = NULL;
  double timeout_s = 60;
  uint64_t nbytes = 0;
  int with_bytes = 0, json = 0, c, code, is_error = 0;
  bh_status_snap snap;
  bh_cli_answer a;
  opterr = 0;
  while ((c = getopt_long(argc, argv, ":h", longs, NULL)) != -1) {
    if (c == 'h') return bh_cli_usage(stdout, "release", BH_CLI_EXIT_OK);
    if (c == '?') return bh_cli_usage_error("release", "unknown option '%s'", argv[optind - 1]);
    if (c == ':') return bh_cli_usage_error("release", "option '%s' needs a value", argv[optind - 1]);
    if (c == O_LEDGER) ledger = optarg;
    if (c == O_JSON) json = 1;
    if (c == O_TIMEOUT && bh_cli_seconds_parse(optarg, 0.1, 86400, &timeout_s) < 0)
      return bh_cli_usage_error("release", "--timeout wants seconds in [0.1, 86400], got '%s'", optarg);
    if (c == O_BYTES) {
      int rc = bh_cli_bytes_parse(optarg, &nbytes);
      if (rc == 0 && (nbytes == 0 || nbytes > (uint64_t)INT64_MAX)) rc = -ERANGE;
      if (rc < 0)
        return bh_cli_usage_error("release",
                                  "--bytes wants a size from 1 byte to 8 EiB such as 512M, 1.5GiB or "
                                  "1000000, got '%s'",
                                  optarg);
      with_bytes = 1;
    }
  }
  if (optind >= argc) return bh_cli_usage_error("release", "which worker? give a PID or a PACK name");
  if (optind + 1 < argc) return bh_cli_usage_error("release", "unexpected argument '%s'", argv[optind + 1]);
  if (ledger && !ledger[0]) return bh_cli_usage_error("release", "--ledger needs a path");
  const char *target = argv[optind];
  if (!target[0]) return bh_cli_usage_error("release", "the worker's PID or PACK is empty");

  int rc = bh_status_snap_take(&snap, ledger, NULL, NULL);
  if (rc < 0) {
    fprintf(stderr, "bulkhead release: cannot read the ledger %s: %s\n", snap.ledger_path, bh_strerror(rc));
    code = BH_CLI_EXIT_LEDGER;
    goto out;
  }
  int i = bh__find(&snap, target, &code);
  if (i < 0) goto out;
  const bh_ledger_record *w = &snap.records[i];
  char pack[4 * 64 + 1];
  bh_text_fit(pack, sizeof pack, w->pack, 64, 0);
  if (w->host_pid <= 0) {
    fprintf(stderr, "bulkhead release: worker %d (%s) has no host to ask (host_pid 0)\n", (int)w->pid, pack);
    code = BH_CLI_EXIT_UNREACHABLE;
    goto out;
  }
  memset(&a, 0, sizeof a);
  code = bh__ask(w->host_pid, w->pid, with_bytes, nbytes, timeout_s, &a, &is_error);
  if (code == BH_CLI_EXIT_REFUSED) {
    char type[4 * 64 + 1];
    bh_text_fit(type, sizeof type, a.type[0] ? a.type : "error", 64, 0);
    fprintf(stderr, "bulkhead release: host %d refused: %s: %s\n", (int)w->host_pid, type, a.message);
  } else if (code == BH_CLI_EXIT_OK) {
    bh_buf out;
    bh_buf_init(&out);
    if (json) {
      bh_text_appendf(&out, "{\"worker_pid\": %" PRId64 ", \"pack\": ", a.worker_pid);
      bh_text_json_str(&out, a.pack, strlen(a.pack));
      bh_text_appendf(&out, ", \"host_pid\": %d, \"asked_bytes\": ", (int)w->host_pid);
      if (with_bytes) bh_text_appendf(&out, "%" PRIu64, nbytes);
      else bh_text_appendf(&out, "null");
      bh_text_appendf(&out,
                     ", \"before_bytes\": %" PRId64 ", \"after_bytes\": %" PRId64 ", \"freed_bytes\": %" PRId64
                     "}\n",
                     a.before_bytes, a.after_bytes, a.freed_bytes);
    } else {
      char x[16], shown[4 * 64 + 1];
      const struct { const char *label; int64_t v; } rows[] = {
          {"before", a.before_bytes}, {"after", a.after_bytes}, {"freed", a.freed_bytes}};
      bh_text_fit(shown, sizeof shown, a.pack[0] ? a.pack : w->pack, 64, 0);
      bh_text_appendf(&out, "released worker %" PRId64 " (%s) of host %d", a.worker_pid, shown, (int)w->host_pid);
      if (with_bytes) {
        bh_text_bytes_format(nbytes, x, sizeof x);
        bh_text_appendf(&out, ", asked for %s", x);
      }
      bh_text_appendf(&out, "\n");
      for (size_t k = 0; k < 3; k++) {
        uint64_t v = rows[k].v > 0 ? (uint64_t)rows[k].v : 0;
        bh_text_bytes_format(v, x, sizeof x);
        bh_text_appendf(&out, "  %-7s %10s  (%" PRIu64 " bytes)\n", rows[k].label, x, v);
      }
    }
    if (out.err == 0) (void)bh_cli_write_all(STDOUT_FILENO, out.data, out.len);
    bh_buf_free(&out);
  }
out:
  bh_status_snap_free(&snap);
  return code;
}
