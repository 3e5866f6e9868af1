/*
 * bulkhead.c -- the `bulkhead` command: see and steer every bulkhead
 * process on this machine (ComfyUI hosts and their node-pack workers).
 *
 *   bulkhead status [--json] [--ledger PATH]
 *   bulkhead top [--interval S] [--once] [--ledger PATH]
 *   bulkhead release PID|PACK [--bytes N] [--timeout S] [--json] [--ledger PATH]
 *   bulkhead install|env PACK_DIR, bulkhead doctor [--json] [COMFYUI_DIR],
 *   bulkhead canary [--json] COMFYUI_DIR
 *     (run by `<python> -m bulkhead VERB`: see bh__python_verb)
 *
 * Reading (status, top) needs nothing but the shared ledger, mapped
 * read-only in spirit: the command never joins it and never creates it.
 * Acting (release) goes through the worker's host, the only process that
 * holds the worker's channel, over the host's control socket.  The verbs
 * live in status_main.c, top.c and release.c (the snapshot they show is
 * the status library's, src/status/); this file parses the verb and runs
 * it, and sits only on top: every help text (the exit codes among them) and
 * the helpers each verb calls back, bh_cli_usage and bh_cli_write_all, are
 * usage.c's.
 *
 * It links the core library only (no Python).
 */
#include "cli.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifndef BH_VERSION
#define BH_VERSION "unknown"
#endif

/* install / env / doctor / canary: environment building is Python's job
 * (pip, venv), and so are importing ComfyUI to check the contract with it
 * and parsing its Python source (the canary reads it with `ast` and the
 * StandIn's signatures off the type), so these verbs run
 * `<python> -m bulkhead VERB ...` with the same arguments
 * and exit status.  Next to a build tree's command the package is found in
 * ../python; elsewhere the Python given must import bulkhead.  Without
 * BULKHEAD_PYTHON the Python is the python3 beside the command, where
 * there is one (pip installs the command into the bin/ of the environment
 * that holds the package), else python3 on PATH. */
static int bh__python_verb(int argc, char **argv) {
  const char *python = getenv("BULKHEAD_PYTHON");
  char exe[PATH_MAX], pkg[PATH_MAX + 64], beside[PATH_MAX + 16];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (n > 0) {
    exe[n] = 0;
    char *slash = strrchr(exe, '/');
    if (slash) *slash = 0;
    snprintf(beside, sizeof beside, "%s/python3", exe);
    if ((!python || !python[0]) && access(beside, X_OK) == 0) python = beside;
    snprintf(pkg, sizeof pkg, "%s/../python/bulkhead/__init__.py", exe);
    if (access(pkg, R_OK) == 0) {
      snprintf(pkg, sizeof pkg, "%s/../python", exe);
      const char *old = getenv("PYTHONPATH");
      char *pp = malloc(strlen(pkg) + (old ? strlen(old) : 0) + 2);
      if (pp) {
        sprintf(pp, "%s%s%s", pkg, old && old[0] ? ":" : "", old ? old : "");
        setenv("PYTHONPATH", pp, 1);
        free(pp);
      }
    }
  }
  if (!python || !python[0]) python = "python3";
  char **av = calloc((size_t)argc + 3, sizeof *av);
  if (!av) return BH_CLI_EXIT_NOTFOUND;
  av[0] = (char *)python;
  av[1] = "-m";
  av[2] = "bulkhead";
  for (int i = 1; i < argc; i++) av[i + 2] = argv[i];
  execvp(python, av);
  fprintf(stderr, "bulkhead %s: cannot run %s: %s (set BULKHEAD_PYTHON to ComfyUI's Python)\n",
          argv[1], python, strerror(errno));
  free(av);
  return 127;
}

int main(int argc, char **argv) {
  if (argc < 2) return bh_cli_usage_error("", "which verb? status, top or release");
  const char *verb = argv[1];
  if (strcmp(verb, "-h") == 0 || strcmp(verb, "--help") == 0) return bh_cli_usage(stdout, "", BH_CLI_EXIT_OK);
  if (strcmp(verb, "--version") == 0) {
    printf("bulkhead %s\n", BH_VERSION);
    return BH_CLI_EXIT_OK;
  }
  if (strcmp(verb, "help") == 0) {
    if (argc > 3) return bh_cli_usage_error("", "help takes one verb at most");
    const char *of = argc == 3 ? argv[2] : "";
    /* The verbs that live elsewhere print their own help. */
    char *help_argv[] = {argv[0], (char *)of, "--help", NULL};
    if (strcmp(of, "install") == 0 || strcmp(of, "env") == 0 || strcmp(of, "doctor") == 0 ||
        strcmp(of, "canary") == 0 || strcmp(of, "uninstall") == 0)
      return bh__python_verb(3, help_argv);
    if (of[0] && strcmp(of, "status") && strcmp(of, "top") && strcmp(of, "release"))
      return bh_cli_usage_error("", "no verb '%s' (status, top, release, install, env, canary, doctor, uninstall)", of);
    return bh_cli_usage(stdout, of, BH_CLI_EXIT_OK);
  }
  /* The verbs parse argv[1..]: getopt sees the verb as its program name. */
  if (strcmp(verb, "status") == 0) return bh_cli_status_main(argc - 1, argv + 1);
  if (strcmp(verb, "top") == 0) return bh_cli_top_main(argc - 1, argv + 1);
  if (strcmp(verb, "release") == 0) return bh_cli_release_main(argc - 1, argv + 1);
  if (strcmp(verb, "install") == 0 || strcmp(verb, "env") == 0 || strcmp(verb, "doctor") == 0 ||
      strcmp(verb, "canary") == 0 || strcmp(verb, "uninstall") == 0)
    return bh__python_verb(argc, argv);
  if (verb[0] == '-') return bh_cli_usage_error("", "unknown option '%s' (options follow the verb)", verb);
  return bh_cli_usage_error("", "unknown verb '%s' (status, top, release, install, env, canary, doctor, uninstall)",
                            verb);
}
