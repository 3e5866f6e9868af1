/*
 * usage.c -- the `bulkhead` command's help texts, and the helpers every
 * verb (status_main.c, top.c, release.c) calls back: bh_cli_usage and
 * bh_cli_usage_error print a verb's help, bh_cli_write_all writes a whole
 * buffer.  bulkhead.c's main sits on top of the verbs and of this file; no
 * verb calls into bulkhead.c.  Every help text is here, so the exit codes
 * are documented in one place (they are the BH_CLI_EXIT_* values of cli.h):
 *
 *   0  success
 *   1  release: no such worker, or a pack name with several workers
 *   2  usage: unknown verb or option, a bad value
 *   3  release: the host cannot be reached (no control socket, refused,
 *      closed, or no answer within --timeout)
 *   4  release: the host answered with an error (its message is printed)
 *   5  the ledger exists but cannot be read (another layout version,
 *      wrong owner or permissions, not a ledger)
 */
#include "cli.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#define BH__EXITS                                                                 \
  "exit codes:\n"                                                                 \
  "  0  success\n"                                                                \
  "  1  no such worker (the message lists the workers found), or a pack\n"        \
  "     name with several workers (the message lists their pids)\n"               \
  "  2  usage error\n"                                                            \
  "  3  the worker's host is unreachable: no control socket (the message\n"       \
  "     names the path), connection refused or closed, or no answer in time\n"    \
  "  4  the host refused: its error message is printed\n"                         \
  "  5  the ledger exists but cannot be read (version, owner, permissions)\n"

#define BH__LEDGER_OPT                                                            \
  "  --ledger PATH   the ledger file (default: $BULKHEAD_LEDGER, else\n"          \
  "                  /dev/shm/bulkhead-<uid>/ledger)\n"

static const char bh__usage_main[] =
    "usage: bulkhead VERB [OPTIONS]\n"
    "\n"
    "See and steer every bulkhead process on this machine: ComfyUI hosts and\n"
    "their node-pack workers, what each holds on each device, and the devices'\n"
    "free memory.  Everything is read from the shared ledger.\n"
    "\n"
    "verbs:\n"
    "  status    every process: state, idle time, bytes held per device, models\n"
    "            and their residency, pins; each device's total and free\n"
    "  top       the same, live (q quits)\n"
    "  release   ask a worker, through its host, to give memory back\n"
    "  install   build a pack's environment(s) from its comfy-env.toml\n"
    "  env       show whether a pack's environment is built and current\n"
    "  canary    check the StandIn against what a ComfyUI checkout reads off\n"
    "            its ledger entries (bulkhead canary --help)\n"
    "  doctor    check bulkhead's contract with a ComfyUI: every name bulkhead\n"
    "            reads or calls there, its tier, whether it is offered\n"
    "            (bulkhead doctor --help)\n"
    "  uninstall list what bulkhead left for this user (environments, caches,\n"
    "            the ledger), with sizes, and remove it after asking\n"
    "  help      this text, or a verb's: bulkhead help VERB\n"
    "\n"
    "`bulkhead VERB --help` explains a verb; --version prints the version.\n"
    "\n"
    "environment:\n"
    "  BULKHEAD_LEDGER        the ledger (default /dev/shm/bulkhead-<uid>/ledger)\n"
    "  BULKHEAD_NVML_LIBRARY  the NVML library to load (default libnvidia-ml.so.1)\n"
    "  XDG_RUNTIME_DIR        where hosts' control sockets are (release --help)\n"
    "  BULKHEAD_PYTHON        the Python that runs install, env, doctor, canary\n"
    "                         and uninstall (default the python3 beside this\n"
    "                         command, as pip installs it into a venv's bin/,\n"
    "                         else python3 on PATH; use ComfyUI's own)\n"
    "\n" BH__EXITS;

static const char bh__usage_status[] =
    "usage: bulkhead status [--json] [--ledger PATH]\n"
    "\n"
    "Every bulkhead process on this machine, hosts each followed by their\n"
    "workers: pid, role, pack, Python version, generation, state (idle, busy,\n"
    "releasing), idle time, bytes held; under each, its devices (held, pinned\n"
    "of the pin ceiling, pager, floor, reserve), its models (resident of size)\n"
    "and its releases.  Above them each device's total and free memory: RAM\n"
    "(clamped to the cgroup) and every GPU NVML lists, or why there are none\n"
    "(\"no NVIDIA driver\" is not an error).  No ledger at all prints \"no\n"
    "bulkhead processes\" and exits 0; the ledger is never created.\n"
    "\n"
    "options:\n"
    "  --json          one JSON document instead (the schema is in the README,\n"
    "                  \"The bulkhead command\"; ComfyUI's GET /bulkhead/status\n"
    "                  serves the same)\n" BH__LEDGER_OPT
    "  -h, --help      this text\n"
    "\n"
    "exit codes: 0 success, 2 usage error, 5 the ledger cannot be read.\n";

static const char bh__usage_top[] =
    "usage: bulkhead top [--interval S] [--once] [--ledger PATH]\n"
    "\n"
    "The status, live: refreshed in place on the terminal's alternate screen,\n"
    "hosts and workers sorted by bytes held, a bar per device and per process\n"
    "(its bytes against the total of the device it holds most on).  Keys: q\n"
    "quits, any other key refreshes now.  The terminal is restored on q, ^C,\n"
    "SIGTERM and SIGHUP.  When stdout is not a terminal, the plain status is\n"
    "printed once per interval instead.\n"
    "\n"
    "options:\n"
    "  --interval S    seconds between refreshes, 0.1 to 3600 (default 1)\n"
    "  --once          print the plain status once and exit\n" BH__LEDGER_OPT
    "  -h, --help      this text\n"
    "\n"
    "exit codes: 0 success (q), 2 usage error, 5 the ledger cannot be read;\n"
    "ended by a signal, it dies of that signal after restoring the terminal.\n";

static const char bh__usage_release[] =
    "usage: bulkhead release PID|PACK [--bytes N] [--timeout S] [--json]\n"
    "                        [--ledger PATH]\n"
    "\n"
    "Asks one worker to release memory: all it can (its full release ladder:\n"
    "models, caches, pins) or, with --bytes, N bytes.  The worker is found in\n"
    "the ledger by pid or by pack name; the request goes to its host's control\n"
    "socket, $XDG_RUNTIME_DIR/bulkhead/host-<pid>.sock when XDG_RUNTIME_DIR is\n"
    "a private directory of ours, else\n"
    "/tmp/bulkhead-<uid>-<pid>-*/host-<pid>.sock (the others are tried too).\n"
    "Prints the bytes the worker held before and after, and the bytes freed.\n"
    "A busy worker is released when its current call ends.\n"
    "\n"
    "options:\n"
    "  --bytes N       release N bytes: 1000000, 512K, 512M, 1.5G (K, M, G, T\n"
    "                  and KiB, MiB, GiB, TiB are powers of 1024; KB, MB, GB,\n"
    "                  TB powers of 1000)\n"
    "  --timeout S     seconds to wait for the host's answer (default 60)\n"
    "  --json          print {\"worker_pid\", \"pack\", \"host_pid\", \"asked_bytes\",\n"
    "                  \"before_bytes\", \"after_bytes\", \"freed_bytes\"}\n" BH__LEDGER_OPT
    "  -h, --help      this text\n"
    "\n" BH__EXITS;

int bh_cli_usage(FILE *f, const char *verb, int code) {
  const char *text = strcmp(verb, "status") == 0    ? bh__usage_status
                     : strcmp(verb, "top") == 0     ? bh__usage_top
                     : strcmp(verb, "release") == 0 ? bh__usage_release
                                                    : bh__usage_main;
  fputs(text, f);
  return code;
}

int bh_cli_usage_error(const char *verb, const char *fmt, ...) {
  va_list ap;
  fprintf(stderr, "bulkhead%s%s: ", verb[0] ? " " : "", verb);
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fputs("\n\n", stderr);
  return bh_cli_usage(stderr, verb, BH_CLI_EXIT_USAGE);
}

int bh_cli_write_all(int fd, const void *p, size_t n) {
  const char *c = p;
  while (n > 0) {
    ssize_t w = write(fd, c, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return -errno;
    }
    c += w;
    n -= (size_t)w;
  }
  return 0;
}
