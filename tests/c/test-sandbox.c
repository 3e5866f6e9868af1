/*
 * test-sandbox.c -- bh_sandbox_apply and a sandboxed bh_proc_spawn
 * (sandbox.c), judged by what a shell in the child can do against the
 * same shell spawned without a sandbox: write beneath the write path, not
 * beside it, not signal its parent; and the spawning process itself stays
 * free (the restriction was a thread's of its own).  A kernel without
 * Landlock passes with a note: there is nothing to judge.
 */
#include "task.h"

#include <stdio.h>
#include <sys/stat.h>
#include <sys/wait.h>

static const char *const env_path[] = {"PATH=/usr/bin:/bin", NULL};

/* What the script printed, run by /bin/sh spawned with sandbox (or NULL). */
static void run_sh(const char *script, const bh_sandbox *sandbox, char *out, size_t n) {
  const char *argv[] = {"sh", "-c", script, NULL};
  bh_spawn_opts o = {.interpreter = "/bin/sh", .argv = argv, .envp = env_path, .stderr_sink = -1,
                     .sandbox = sandbox};
  bh_proc *p;
  int chan, st;
  ASSERT_OK(bh_proc_spawn(&o, &p, &chan));
  ASSERT_OK(bh_proc_wait(p, 10000, &st));
  ASSERT_EQ(WEXITSTATUS(st), 0);
  bh_proc_output_tail(p, out, n);
  bh_proc_close(p);
  close(chan);
}

TEST_IMPL(sandbox_spawned_child_is_inside) {
  if (bh_sandbox_abi() <= 0) {
    fprintf(stderr, "# this kernel has no Landlock: nothing to judge\n");
    return 0;
  }
  int fds0 = bh_test_fd_count();
  char root[] = "/tmp/bh-test-sandbox-XXXXXX", inside[64], beside[64], script[512];
  ASSERT(mkdtemp(root) != NULL);
  snprintf(inside, sizeof inside, "%s/inside", root);
  snprintf(beside, sizeof beside, "%s/beside", root);
  ASSERT_OK(mkdir(inside, 0700));
  ASSERT_OK(mkdir(beside, 0700));
  snprintf(script, sizeof script,
           "echo x > %s/f && echo in-ok; { echo x > %s/f; } 2>/dev/null && echo beside-ok; "
           "kill -0 $PPID 2>/dev/null && echo signal-ok; true", inside, beside);
  const char *read[] = {"/usr", "/bin", "/lib", "/lib64", "/etc", "/proc", "/dev", NULL};
  const char *write[] = {inside, NULL}, *devices[] = {"/dev/null", NULL};
  bh_sandbox sb = {.read = read, .write = write, .devices = devices, .network = 1};
  char bare[256], boxed[256];
  run_sh(script, NULL, bare, sizeof bare);
  ASSERT_STR_EQ(bare, "in-ok\nbeside-ok\nsignal-ok\n");   /* each can succeed */
  run_sh(script, &sb, boxed, sizeof boxed);
  ASSERT_STR_EQ(boxed, "in-ok\n");
  /* The spawning thread was one of its own: this process writes anywhere still. */
  char path[96];
  snprintf(path, sizeof path, "%s/g", beside);
  FILE *f = fopen(path, "w");
  ASSERT(f != NULL);
  fclose(f);
  char rm[128];
  snprintf(rm, sizeof rm, "rm -rf %s", root);
  ASSERT_EQ(system(rm), 0);
  ASSERT_FD_COUNT(fds0);
  return 0;
}
