/*
 * top.c -- `bulkhead top`: the status snapshot, live, redrawn in place.
 *
 * On a terminal (stdout a TTY) the screen is taken over the way top(1)
 * does: the alternate screen (ESC[?1049h) with the cursor hidden
 * (ESC[?25l), each frame drawn from the home position with every line
 * cleared to its end and the rest of the screen cleared below, so nothing
 * scrolls or flickers.  stdin, when it is a TTY, goes into a raw mode
 * (ICANON and ECHO off, ISIG kept so ^C still signals) to read single keys:
 * q (or Q) quits, any other key redraws at once.  The terminal's window
 * size is read (TIOCGWINSZ) on every frame and on SIGWINCH; every line is
 * clipped to its width (80 columns and more get a bar per process) and
 * the frame to its height.
 *
 * What is changed is always put back: on q, on SIGINT, SIGTERM, SIGHUP
 * (the terminal restored, then the signal re-raised with its default
 * action so the parent sees how we ended), on SIGTSTP (restored before
 * stopping, taken over again on SIGCONT), and at exit.  Signal handlers
 * only set flags; the loop does the work.
 *
 * When stdout is not a TTY (a pipe, a log), or with --once, `top` prints
 * the plain `status` table once per interval (exactly once with --once).
 *
 * Frame layout (80 columns):
 *
 *   bulkhead top  3 processes  every 1.0s  q quits                 12:34:56
 *   ledger /dev/shm/bulkhead-1000/ledger
 *   cpu      [||||||||||||......................]    5.4 GiB of   15.6 GiB used
 *   cuda:0   [|||...............................]   12.0 GiB of  140.0 GiB used
 *
 *   PID       ROLE   PACK               STATE     IDLE       HELD  OF DEVICE
 *   4100      host   host               idle       12s    1.2 GiB  [|.......]
 *     4120    worker pack-a             busy        0s    4.0 GiB  [|||.....]
 *
 * Groups (a host and its workers) are sorted by the bytes they hold, and
 * workers within a group too; a process's bar is its held bytes against
 * the total of the device it holds most on.
 */
#include "cli.h"

#include <errno.h>
#include <inttypes.h>
#include <getopt.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/ioctl.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>

#define BH_TOP_ENTER "\033[?1049h\033[?25l"
#define BH_TOP_LEAVE "\033[?25h\033[?1049l"

static volatile sig_atomic_t g_signal; /* SIGINT/SIGTERM/SIGHUP received */
static volatile sig_atomic_t g_winch, g_tstp;

static struct {
  int raw;     /* stdin in raw mode: `saved` holds what to restore */
  int screen;  /* the alternate screen is on */
  struct termios saved;
} g_term;

static void bh__on_signal(int sig) {
  if (sig == SIGWINCH) g_winch = 1;
  else if (sig == SIGTSTP) g_tstp = 1;
  else g_signal = sig;
}

/* Puts the terminal back as we found it.  Idempotent; also runs at exit. */
static void bh__term_restore(void) {
  if (g_term.screen) {
    (void)bh_cli_write_all(STDOUT_FILENO, BH_TOP_LEAVE, sizeof BH_TOP_LEAVE - 1);
    g_term.screen = 0;
  }
  if (g_term.raw) {
    (void)tcsetattr(STDIN_FILENO, TCSADRAIN, &g_term.saved);
    g_term.raw = 0;
  }
}

/* Takes the terminal over: raw keys (when stdin is a TTY), the alternate
 * screen, the cursor hidden. */
static void bh__term_take(int keys) {
  if (keys && tcgetattr(STDIN_FILENO, &g_term.saved) == 0) {
    struct termios t = g_term.saved;
    t.c_lflag &= (tcflag_t) ~(ICANON | ECHO);
    t.c_cc[VMIN] = 0;
    t.c_cc[VTIME] = 0;
    if (tcsetattr(STDIN_FILENO, TCSADRAIN, &t) == 0) g_term.raw = 1;
  }
  if (bh_cli_write_all(STDOUT_FILENO, BH_TOP_ENTER, sizeof BH_TOP_ENTER - 1) == 0) g_term.screen = 1;
}

static void bh__term_size(unsigned *cols, unsigned *rows) {
  struct winsize ws;
  *cols = 80;
  *rows = 24;
  if (ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0) {
    if (ws.ws_col > 0) *cols = ws.ws_col;
    if (ws.ws_row > 0) *rows = ws.ws_row;
  }
}

/* The probed device a ledger device name refers to: by name, or for
 * "cuda:GPU-..." / "cuda:MIG-..." by UUID. */
static const bh_status_device *bh__device_of(const bh_status_snap *s, const char *name) {
  for (int i = 0; i < s->n_devices; i++) {
    const bh_status_device *d = &s->devices[i];
    if (strcmp(d->device, name) == 0) return d;
    if (d->uuid[0] && strncmp(name, "cuda:", 5) == 0 && strcasecmp(name + 5, d->uuid) == 0) return d;
  }
  return NULL;
}

/* One frame into b: at most `rows` lines, each at most `cols` wide, each
 * ended by clear-to-end-of-line; lines are separated by CR LF (no newline
 * after the last, so the screen never scrolls). */
static void bh__frame(bh_buf *b, const bh_status_snap *s, double interval, unsigned cols, unsigned rows) {
  int idx[BH_LEDGER_SLOTS], depth[BH_LEDGER_SLOTS];
  char x[16], y[16], pid[16], pack[4 * 18 + 1], idle[16], bar[512], clock[16];
  unsigned line = 0;
  size_t start;
  time_t now = time(NULL);
  struct tm tm;
  if (localtime_r(&now, &tm)) strftime(clock, sizeof clock, "%H:%M:%S", &tm);
  else clock[0] = 0;

#define BH__LINE_BEGIN() (start = b->len)
#define BH__LINE_END()                                   \
  do {                                                   \
    bh_text_line_clip(b, start, cols);                    \
    bh_text_appendf(b, "\033[K");                         \
    if (++line < rows) bh_text_appendf(b, "\r\n");        \
  } while (0)

  bh_text_appendf(b, "\033[H");
  BH__LINE_BEGIN();
  {
    char head[128];
    int n = snprintf(head, sizeof head, "bulkhead top  %d process%s  every %.1fs  q quits", s->n_records,
                     s->n_records == 1 ? "" : "es", interval);
    int pad = (int)cols - n - (int)strlen(clock);
    bh_text_appendf(b, "%s%*s%s", head, pad > 1 ? pad : 1, "", clock);
  }
  BH__LINE_END();
  if (line < rows) {
    BH__LINE_BEGIN();
    bh_text_appendf(b, "ledger %s%s", s->ledger_path, s->ledger_present ? "" : " (none: nobody joined)");
    BH__LINE_END();
  }
  /* Device bars: name(8) [bar] "  <used> of <total> used" */
  for (int i = 0; i < s->n_devices && line < rows; i++) {
    const bh_status_device *d = &s->devices[i];
    uint64_t used = d->total_bytes > d->free_bytes ? d->total_bytes - d->free_bytes : 0;
    char tail[64];
    bh_text_bytes_format(used, x, sizeof x);
    bh_text_bytes_format(d->total_bytes, y, sizeof y);
    snprintf(tail, sizeof tail, "  %10s of %10s used", x, y); /* fixed width: bars line up */
    int w = (int)cols - 8 - 1 - 2 - (int)strlen(tail);
    BH__LINE_BEGIN();
    bh_text_appendf(b, "%-8s ", d->device);
    if (w >= 4) {
      if (w > (int)sizeof bar - 1) w = (int)sizeof bar - 1;
      bh_cli_bar(bar, used, d->total_bytes, (unsigned)w);
      bh_text_appendf(b, "[%s]", bar);
    }
    bh_text_appendf(b, "%s", tail);
    BH__LINE_END();
  }
  if (s->gpu_error[0] && line < rows) {
    BH__LINE_BEGIN();
    bh_text_appendf(b, "%-8s %s", "gpu", s->gpu_error);
    BH__LINE_END();
  }
  if (line < rows) {
    BH__LINE_BEGIN();
    BH__LINE_END();
  }
  int n = bh_status_snap_order(s, 1, idx, depth);
  if (n == 0 && line < rows) {
    BH__LINE_BEGIN();
    bh_text_appendf(b, "no bulkhead processes");
    BH__LINE_END();
  }
  /* PID(9) ROLE(6) PACK(18) STATE(9) IDLE(7) HELD(10) = 64 columns, then
   * "  [bar]" in what is left. */
  int barw = (int)cols - 64 - 4;
  if (barw > (int)sizeof bar - 1) barw = (int)sizeof bar - 1;
  if (n > 0 && line < rows) {
    BH__LINE_BEGIN();
    bh_text_appendf(b, "%-9s %-6s %-18s %-9s %7s %10s%s", "PID", "ROLE", "PACK", "STATE", "IDLE", "HELD",
                   barw >= 4 ? "  OF DEVICE" : "");
    BH__LINE_END();
  }
  uint64_t max_held = 1;
  for (int k = 0; k < n; k++) {
    uint64_t h = bh_status_record_held(&s->records[idx[k]]);
    if (h > max_held) max_held = h;
  }
  for (int k = 0; k < n && line < rows; k++) {
    const bh_ledger_record *r = &s->records[idx[k]];
    if (line == rows - 1 && k < n - 1) { /* the last row says what did not fit */
      BH__LINE_BEGIN();
      bh_text_appendf(b, "... %d more", n - k);
      BH__LINE_END();
      break;
    }
    uint64_t held = bh_status_record_held(r), whole = max_held;
    const bh_ledger_device *most = NULL;
    for (uint32_t i = 0; i < r->n_devices && i < BH_LEDGER_DEVICES; i++)
      if (!most || r->devices[i].held_bytes > most->held_bytes) most = &r->devices[i];
    const bh_status_device *dev = most ? bh__device_of(s, most->device) : NULL;
    if (dev && dev->total_bytes) whole = dev->total_bytes;
    snprintf(pid, sizeof pid, "%s%d", depth[k] ? "  " : "", (int)r->pid);
    bh_text_fit(pack, sizeof pack, r->pack[0] ? r->pack : "-", 18, 1);
    bh_text_idle_format(r->last_used_ns ? s->now_ns - (int64_t)r->last_used_ns : -1, idle, sizeof idle);
    bh_text_bytes_format(held, x, sizeof x);
    BH__LINE_BEGIN();
    bh_text_appendf(b, "%-9s %-6s %s %-9s %7s %10s", pid, bh_status_role_name(r->role), pack,
                   bh_status_run_name(r->run), idle, x);
    if (barw >= 4) {
      bh_cli_bar(bar, held, whole, (unsigned)barw);
      bh_text_appendf(b, "  [%s]", bar);
    }
    BH__LINE_END();
  }
  bh_text_appendf(b, "\033[J");
#undef BH__LINE_BEGIN
#undef BH__LINE_END
}

/* Not a terminal (or --once): the status table, once per interval. */
static int bh__top_plain(const char *ledger, double interval, int once) {
  bh_status_probes probes;
  int code = BH_CLI_EXIT_OK;
  bh_status_probes_open(&probes);
  for (int frame = 0;; frame++) {
    bh_status_snap snap;
    bh_buf out;
    bh_buf_init(&out);
    int rc = bh_status_snap_take(&snap, ledger, NULL, &probes);
    if (rc == 0) {
      if (frame > 0) bh_text_appendf(&out, "\n");
      rc = bh_status_text(&out, &snap, 80);
      if (rc == 0) rc = bh_cli_write_all(STDOUT_FILENO, out.data, out.len);
    } else {
      fprintf(stderr, "bulkhead top: cannot read the ledger %s: %s\n", snap.ledger_path, bh_strerror(rc));
    }
    bh_status_snap_free(&snap);
    bh_buf_free(&out);
    if (rc < 0) {
      code = BH_CLI_EXIT_LEDGER;
      break;
    }
    if (once) break;
    struct timespec ts = {(time_t)interval, (long)((interval - (double)(time_t)interval) * 1e9)};
    while (nanosleep(&ts, &ts) < 0 && errno == EINTR) {
    }
  }
  bh_status_probes_close(&probes);
  return code;
}

/* The live screen.  Returns an exit code, or re-raises a fatal signal. */
static int bh__top_screen(const char *ledger, double interval) {
  struct sigaction sa, old[5];
  static const int sigs[] = {SIGINT, SIGTERM, SIGHUP, SIGWINCH, SIGTSTP};
  bh_status_probes probes;
  int keys = isatty(STDIN_FILENO), code = BH_CLI_EXIT_OK, quit = 0;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = bh__on_signal; /* no SA_RESTART: poll returns EINTR */
  sigemptyset(&sa.sa_mask);
  for (int i = 0; i < 5; i++) sigaction(sigs[i], &sa, &old[i]);
  atexit(bh__term_restore);
  bh_status_probes_open(&probes);
  bh__term_take(keys);
  int64_t next = 0;
  while (!quit && !g_signal) {
    if (g_tstp) { /* ^Z: give the terminal back, stop, take it again */
      g_tstp = 0;
      bh__term_restore();
      signal(SIGTSTP, SIG_DFL);
      raise(SIGTSTP);
      sigaction(SIGTSTP, &sa, NULL);
      bh__term_take(keys);
      next = 0;
    }
    int64_t now = bh_now_ns();
    if (g_winch || now >= next) {
      g_winch = 0;
      unsigned cols, rows;
      bh_status_snap snap;
      bh_buf out;
      bh_buf_init(&out);
      bh__term_size(&cols, &rows);
      int rc = bh_status_snap_take(&snap, ledger, NULL, &probes);
      if (rc < 0) {
        bh__term_restore();
        fprintf(stderr, "bulkhead top: cannot read the ledger %s: %s\n", snap.ledger_path, bh_strerror(rc));
        code = BH_CLI_EXIT_LEDGER;
        quit = 1;
      } else {
        bh__frame(&out, &snap, interval, cols, rows);
        if (out.err == 0) (void)bh_cli_write_all(STDOUT_FILENO, out.data, out.len);
      }
      bh_status_snap_free(&snap);
      bh_buf_free(&out);
      next = now + (int64_t)(interval * 1e9);
      continue;
    }
    struct pollfd pfd = {.fd = STDIN_FILENO, .events = POLLIN};
    int64_t wait_ms = (next - now + 999999) / 1000000;
    int pr = poll(keys ? &pfd : NULL, keys ? 1 : 0, (int)wait_ms);
    if (pr > 0 && (pfd.revents & (POLLIN | POLLHUP))) {
      char k[64];
      ssize_t got = read(STDIN_FILENO, k, sizeof k);
      if (got <= 0) {
        if (got == 0 || errno != EINTR) keys = 0; /* EOF: nobody can press q any more */
        continue;
      }
      for (ssize_t i = 0; i < got; i++)
        if (k[i] == 'q' || k[i] == 'Q') quit = 1;
      next = 0; /* any other key: redraw now */
    }
  }
  bh__term_restore();
  bh_status_probes_close(&probes);
  for (int i = 0; i < 5; i++) sigaction(sigs[i], &old[i], NULL);
  if (g_signal) {
    int sig = g_signal;
    signal(sig, SIG_DFL);
    raise(sig);
    return 128 + sig;
  }
  return code;
}

int bh_cli_top_main(int argc, char **argv) {
  enum { O_LEDGER = 256, O_INTERVAL, O_ONCE };
  static const struct option longs[] = {{"help", no_argument, NULL, 'h'},
                                        {"interval", required_argument, NULL, O_INTERVAL},
                                        {"once", no_argument, NULL, O_ONCE},
                                        {"ledger", required_argument, NULL, O_LEDGER},
                                        {NULL, 0, NULL, 0}};
  const char *ledger = NULL;
  double interval = 1.0;
  int once = 0, c;
  opterr = 0;
  while ((c = getopt_long(argc, argv, ":h", longs, NULL)) != -1) {
    if (c == 'h') return bh_cli_usage(stdout, "top", BH_CLI_EXIT_OK);
    if (c == '?') return bh_cli_usage_error("top", "unknown option '%s'", argv[optind - 1]);
    if (c == ':') return bh_cli_usage_error("top", "option '%s' needs a value", argv[optind - 1]);
    if (c == O_ONCE) once = 1;
    if (c == O_LEDGER) ledger = optarg;
    if (c == O_INTERVAL && bh_cli_seconds_parse(optarg, 0.1, 3600, &interval) < 0)
      return bh_cli_usage_error("top", "--interval wants seconds in [0.1, 3600], got '%s'", optarg);
  }
  if (optind < argc) return bh_cli_usage_error("top", "unexpected argument '%s'", argv[optind]);
  if (ledger && !ledger[0]) return bh_cli_usage_error("top", "--ledger needs a path");
  if (once || !isatty(STDOUT_FILENO)) return bh__top_plain(ledger, interval, once);
  return bh__top_screen(ledger, interval);
}
