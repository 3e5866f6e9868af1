/*
 * test-ledger.c -- the machine-wide ledger: creating, validating and
 * refusing segment files; joining and leaving; a process's own devices and
 * models; records of other (forked) processes; reaping the records of
 * killed processes and of reused pids; the robust mutex after its holder
 * died; seqlock reads against a writer that never stops; a full ledger;
 * forked children that must not own their parent's record; and the last
 * handle out unlinking the file.
 *
 * Every test uses its own file under /tmp (never the default /dev/shm
 * path, which other bulkhead processes of this user may have open) and
 * checks it is gone at the end.  Peers are forked children of the test,
 * synchronised over pipes; each is reaped before the test returns.
 */
#include "task.h"

#include "bulkhead/ledger.h"
#include "src/core/internal.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>

#define LEDGER_BYTES 2248704 /* 4096 + 512 records of 4384 */

static void tpath(char *buf, size_t n, const char *tag) {
  snprintf(buf, n, "/tmp/bh-ledger-test-%d-%s", (int)getpid(), tag);
  unlink(buf);
}

static int exists(const char *p) {
  struct stat st;
  return lstat(p, &st) == 0;
}

static void put_byte(int fd) {
  char c = 'x';
  ASSERT_EQ(write(fd, &c, 1), 1);
}

static void get_byte(int fd) {
  char c;
  ssize_t r;
  while ((r = read(fd, &c, 1)) < 0 && errno == EINTR) {
  }
  ASSERT_EQ(r, 1);
}

/* A child's end of the test: blocks until the parent closes its end. */
static void wait_eof(int fd) {
  char c;
  while (read(fd, &c, 1) != 0) {
  }
}

static void reap(pid_t pid, int expect_status) {
  int status;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  if (expect_status >= 0) {
    if (!WIFEXITED(status) || WEXITSTATUS(status) != expect_status)
      FAIL("child %d: status 0x%x, expected exit %d", (int)pid, status, expect_status);
  }
}

static void write_file(const char *path, const void *data, size_t n, off_t size) {
  int fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  ASSERT_SYS(fd);
  if (n) ASSERT_EQ(pwrite(fd, data, n, 0), (ssize_t)n);
  ASSERT_SYS(ftruncate(fd, size));
  close(fd);
}

/* A header as ledger.c writes it (its layout comment): magic, version,
 * head_bytes, record_bytes, record_count, mutex_bytes. */
static void header(uint8_t h[32], uint32_t version) {
  memset(h, 0, 32);
  memcpy(h, "BHLEDGR", 8);
  uint32_t v[5] = {version, 4096, 4384, BH_LEDGER_SLOTS, (uint32_t)sizeof(pthread_mutex_t)};
  memcpy(h + 8, v, sizeof v);
}

static int count_records(bh_ledger *l) {
  bh_ledger_record r[BH_LEDGER_SLOTS];
  int n = bh_ledger_snapshot(l, r, BH_LEDGER_SLOTS);
  ASSERT_GE(n, 0);
  return n;
}

/* ------------------------------------------------------------------------ */

TEST_IMPL(ledger_open_init) {
  char p[128];
  tpath(p, sizeof p, "init");
  int fds0 = bh_test_fd_count();
  bh_ledger *l;
  ASSERT_OK(bh_ledger_open(&l, p));
  ASSERT_STR_EQ(bh_ledger_path(l), p);
  struct stat st;
  ASSERT_SYS(stat(p, &st));
  ASSERT_EQ(st.st_size, LEDGER_BYTES);
  ASSERT_EQ(st.st_mode & 07777, 0600);
  ASSERT_EQ(st.st_uid, geteuid());
  char magic[8];
  int fd = open(p, O_RDONLY | O_CLOEXEC);
  ASSERT_SYS(fd);
  ASSERT_EQ(pread(fd, magic, 8, 0), 8);
  ASSERT_MEM_EQ(magic, "BHLEDGR", 8);
  uint32_t v;
  ASSERT_EQ(pread(fd, &v, 4, 8), 4);
  ASSERT_EQ(v, BH_LEDGER_VERSION);
  close(fd);
  /* The fd is close-on-exec. */
  ASSERT_EQ(bh_test_fd_count(), fds0 + 1);
  /* A second handle validates what the first created. */
  bh_ledger *l2;
  ASSERT_OK(bh_ledger_open(&l2, p));
  ASSERT_EQ(count_records(l2), 0);
  bh_ledger_close(l2);
  ASSERT(exists(p));
  bh_ledger_close(l);
  ASSERT(!exists(p));
  ASSERT_EQ(bh_test_fd_count(), fds0);
  bh_ledger_close(NULL);
  return 0;
}

TEST_IMPL(ledger_default_path) {
  char buf[256], want[64];
  unsetenv("BULKHEAD_LEDGER");
  snprintf(want, sizeof want, "/dev/shm/bulkhead-%u/ledger", (unsigned)geteuid());
  ASSERT_EQ(bh_ledger_default_path(buf, sizeof buf), (int)strlen(want));
  ASSERT_STR_EQ(buf, want);
  ASSERT_RC(bh_ledger_default_path(buf, 5), -ENAMETOOLONG);
  setenv("BULKHEAD_LEDGER", "", 1);
  ASSERT_GT(bh_ledger_default_path(buf, sizeof buf), 0);
  ASSERT_STR_EQ(buf, want);
  char p[128];
  tpath(p, sizeof p, "env");
  setenv("BULKHEAD_LEDGER", p, 1);
  ASSERT_GT(bh_ledger_default_path(buf, sizeof buf), 0);
  ASSERT_STR_EQ(buf, p);
  bh_ledger *l;
  ASSERT_OK(bh_ledger_open(&l, NULL));
  ASSERT_STR_EQ(bh_ledger_path(l), p);
  ASSERT(exists(p));
  bh_ledger_close(l);
  ASSERT(!exists(p));
  unsetenv("BULKHEAD_LEDGER");
  return 0;
}

TEST_IMPL(ledger_bad_magic) {
  char p[128];
  tpath(p, sizeof p, "magic");
  bh_ledger *l = NULL;
  uint8_t h[32];
  header(h, BH_LEDGER_VERSION);
  memcpy(h, "NOTLEDGR", 8);
  write_file(p, h, sizeof h, LEDGER_BYTES);
  ASSERT_RC(bh_ledger_open(&l, p), -BH_ELEDGER);
  ASSERT_NULL(l);
  ASSERT(exists(p)); /* not ours to remove */
  /* Anything else at all. */
  write_file(p, "hello world, not a ledger", 25, 25);
  ASSERT_RC(bh_ledger_open(&l, p), -BH_ELEDGER);
  write_file(p, "BH", 2, 2);
  ASSERT_RC(bh_ledger_open(&l, p), -BH_ELEDGER);
  /* All zeros at another size: not what a dying creator leaves. */
  write_file(p, NULL, 0, 8192);
  ASSERT_RC(bh_ledger_open(&l, p), -BH_ELEDGER);
  /* All zeros at full size: a creator died between ftruncate and the
   * header (it held the file lock, so it is gone): initialised again. */
  write_file(p, NULL, 0, LEDGER_BYTES);
  ASSERT_OK(bh_ledger_open(&l, p));
  ASSERT_GE(bh_ledger_join(l, BH_ROLE_TOOL, "", "", 0, 0), 0);
  bh_ledger_close(l);
  ASSERT(!exists(p));
  return 0;
}

/* bh__ledger_open_mem (what fuzz/fuzz_ledger.c opens its inputs with)
 * judges an image exactly as bh_ledger_open judges a file holding the same
 * bytes, and a handle on memory reads, joins and closes without an fd. */
TEST_IMPL(ledger_open_mem_same_verdicts) {
  char p[128];
  tpath(p, sizeof p, "mem");
  int fds0 = bh_test_fd_count();
  struct {
    const char *what;
    uint32_t version;
    const char *magic;
    size_t size;
    uint32_t record_bytes;
  } cases[] = {
      {"valid", BH_LEDGER_VERSION, "BHLEDGR", LEDGER_BYTES, 4384},
      {"bad magic", BH_LEDGER_VERSION, "NOTLEDGR", LEDGER_BYTES, 4384},
      {"other version", BH_LEDGER_VERSION + 1, "BHLEDGR", LEDGER_BYTES, 4384},
      {"other version, other size", BH_LEDGER_VERSION + 1, "BHLEDGR", 65536, 4384},
      {"short", BH_LEDGER_VERSION, "BHLEDGR", 8192, 4384},
      {"long", BH_LEDGER_VERSION, "BHLEDGR", LEDGER_BYTES + 4096, 4384},
      {"record size", BH_LEDGER_VERSION, "BHLEDGR", LEDGER_BYTES, 3137},
      {"all zero", 0, NULL, LEDGER_BYTES, 0},
      {"all zero, short", 0, NULL, 8192, 0},
      {"two bytes", 0, "BH", 2, 0},
      {"header only", BH_LEDGER_VERSION, "BHLEDGR", 32, 4384},
  };
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
    fprintf(stderr, "case: %s\n", cases[k].what);
    uint8_t *img = calloc(1, cases[k].size);
    ASSERT_NOT_NULL(img);
    if (cases[k].version) {
      uint8_t h[32];
      header(h, cases[k].version);
      memcpy(h + 16, &cases[k].record_bytes, 4);
      memcpy(img, h, cases[k].size < 32 ? cases[k].size : 32);
    }
    if (cases[k].magic) memcpy(img, cases[k].magic, cases[k].size < 8 ? cases[k].size : 8);
    if (cases[k].version && cases[k].size >= 64) {
      /* A creator's mutex, as in a real file. */
      pthread_mutexattr_t a;
      pthread_mutex_t mu;
      pthread_mutexattr_init(&a);
      pthread_mutexattr_setpshared(&a, PTHREAD_PROCESS_SHARED);
      pthread_mutexattr_setrobust(&a, PTHREAD_MUTEX_ROBUST);
      pthread_mutex_init(&mu, &a);
      memcpy(img + 32, &mu, sizeof mu);
    }
    write_file(p, img, cases[k].size, (off_t)cases[k].size);
    bh_ledger *lf = NULL, *lm = NULL;
    int rf = bh_ledger_open(&lf, p);
    int rm = bh__ledger_open_mem(&lm, img, cases[k].size);
    ASSERT_RC(rm, rf);
    if (rf == 0) {
      ASSERT_EQ(count_records(lm), 0);
      ASSERT_GE(bh_ledger_join(lm, BH_ROLE_TOOL, "mem", "", 0, 0), 0);
      ASSERT_EQ(count_records(lm), 1);
      ASSERT_EQ(count_records(lf), 0); /* two images, not one */
      ASSERT_STR_EQ(bh_ledger_path(lm), "");
      bh_ledger_close(lm); /* leaves; nothing to unlink */
      ASSERT_EQ(count_records(lf), 0);
      bh_ledger_close(lf);
    } else {
      ASSERT_NULL(lm);
      ASSERT_NULL(lf);
      unlink(p);
    }
    free(img);
  }
  /* The one difference: an empty file is where bh_ledger_open creates the
   * ledger; an image cannot grow. */
  uint8_t none = 0;
  bh_ledger *lm = NULL;
  ASSERT_RC(bh__ledger_open_mem(&lm, &none, 0), -BH_ELEDGER);
  ASSERT_RC(bh__ledger_open_mem(&lm, NULL, LEDGER_BYTES), -EINVAL);
  ASSERT_RC(bh__ledger_open_mem(NULL, &none, 0), -EINVAL);
  ASSERT(!exists(p));
  ASSERT_FD_COUNT(fds0);
  return 0;
}

TEST_IMPL(ledger_wrong_version) {
  char p[128];
  tpath(p, sizeof p, "version");
  bh_ledger *l = NULL;
  uint8_t h[32];
  header(h, BH_LEDGER_VERSION + 1);
  write_file(p, h, sizeof h, LEDGER_BYTES);
  ASSERT_RC(bh_ledger_open(&l, p), -BH_ELEDGERVER);
  /* Another version may have another size too: the version is named. */
  write_file(p, h, sizeof h, 65536);
  ASSERT_RC(bh_ledger_open(&l, p), -BH_ELEDGERVER);
  /* A live segment whose version changes under a second opener. */
  unlink(p);
  bh_ledger *a;
  ASSERT_OK(bh_ledger_open(&a, p));
  int fd = open(p, O_RDWR | O_CLOEXEC);
  uint32_t v = 77;
  ASSERT_EQ(pwrite(fd, &v, 4, 8), 4);
  ASSERT_RC(bh_ledger_open(&l, p), -BH_ELEDGERVER);
  v = BH_LEDGER_VERSION;
  ASSERT_EQ(pwrite(fd, &v, 4, 8), 4);
  /* Other geometry, same version: not a ledger we can read. */
  v = 63;
  ASSERT_EQ(pwrite(fd, &v, 4, 20), 4);
  ASSERT_RC(bh_ledger_open(&l, p), -BH_ELEDGER);
  v = BH_LEDGER_SLOTS;
  ASSERT_EQ(pwrite(fd, &v, 4, 20), 4);
  close(fd);
  ASSERT_OK(bh_ledger_open(&l, p));
  bh_ledger_close(l);
  bh_ledger_close(a);
  ASSERT(!exists(p));
  return 0;
}

TEST_IMPL(ledger_truncated) {
  char p[128];
  tpath(p, sizeof p, "trunc");
  bh_ledger *l = NULL;
  uint8_t h[32];
  header(h, BH_LEDGER_VERSION);
  write_file(p, h, sizeof h, 4096);
  ASSERT_RC(bh_ledger_open(&l, p), -BH_ELEDGER);
  write_file(p, h, sizeof h, LEDGER_BYTES - 1);
  ASSERT_RC(bh_ledger_open(&l, p), -BH_ELEDGER);
  write_file(p, h, sizeof h, LEDGER_BYTES + 4096);
  ASSERT_RC(bh_ledger_open(&l, p), -BH_ELEDGER);
  write_file(p, h, 16, 16); /* the header itself cut short */
  ASSERT_RC(bh_ledger_open(&l, p), -BH_ELEDGER);
  ASSERT_NULL(l);
  unlink(p);
  return 0;
}

TEST_IMPL(ledger_permissions) {
  char p[128], q[128];
  tpath(p, sizeof p, "perm");
  tpath(q, sizeof q, "perm-link");
  bh_ledger *a, *l = NULL;
  ASSERT_OK(bh_ledger_open(&a, p));
  ASSERT_SYS(chmod(p, 0644));
  ASSERT_RC(bh_ledger_open(&l, p), -EACCES);
  ASSERT_SYS(chmod(p, 0660));
  ASSERT_RC(bh_ledger_open(&l, p), -EACCES);
  ASSERT_SYS(chmod(p, 0602));
  ASSERT_RC(bh_ledger_open(&l, p), -EACCES);
  ASSERT_SYS(chmod(p, 0600));
  if (geteuid() == 0) {
    ASSERT_SYS(chown(p, 12345, (gid_t)-1));
    ASSERT_RC(bh_ledger_open(&l, p), -EPERM);
    ASSERT_SYS(chown(p, 0, (gid_t)-1));
  } else {
    fprintf(stderr, "not root: the other-owner case is not exercised\n");
  }
  /* A symlink at the path is refused, whatever it points at. */
  ASSERT_SYS(symlink(p, q));
  ASSERT_RC(bh_ledger_open(&l, q), -ELOOP);
  unlink(q);
  /* Not a regular file. */
  ASSERT_SYS(mkfifo(q, 0600));
  ASSERT_RC(bh_ledger_open(&l, q), -EINVAL);
  unlink(q);
  ASSERT_NULL(l);
  /* The umask cannot widen what we create. */
  ASSERT_OK(bh_ledger_open(&l, p));
  bh_ledger_close(l);
  bh_ledger_close(a);
  ASSERT(!exists(p));
  return 0;
}

TEST_IMPL(ledger_bad_args) {
  char p[128];
  tpath(p, sizeof p, "args");
  bh_ledger *l;
  ASSERT_RC(bh_ledger_open(NULL, p), -EINVAL);
  ASSERT_RC(bh_ledger_open(&l, ""), -EINVAL);
  ASSERT_RC(bh_ledger_open(&l, "/nonexistent-dir/x/ledger"), -ENOENT);
  ASSERT_OK(bh_ledger_open(&l, p));
  char big[100];
  memset(big, 'a', sizeof big - 1);
  big[sizeof big - 1] = 0;
  ASSERT_RC(bh_ledger_join(l, 0, "", "", 0, 0), -EINVAL);
  ASSERT_RC(bh_ledger_join(l, 4, "", "", 0, 0), -EINVAL);
  ASSERT_RC(bh_ledger_join(l, BH_ROLE_HOST, "", "", 0, -1), -EINVAL);
  ASSERT_RC(bh_ledger_join(l, BH_ROLE_HOST, big, "", 0, 0), -ENAMETOOLONG);
  big[BH_LEDGER_INTERP_MAX] = 0;
  ASSERT_RC(bh_ledger_join(l, BH_ROLE_HOST, "", big, 0, 0), -ENAMETOOLONG);
  big[BH_LEDGER_INTERP_MAX - 1] = 0; /* exactly fills the field */
  ASSERT_GE(bh_ledger_join(l, BH_ROLE_HOST, NULL, big, 0, 0), 0);
  bh_ledger_record r;
  ASSERT_OK(bh_ledger_read(l, getpid(), &r));
  ASSERT_STR_EQ(r.interpreter, big);
  ASSERT_STR_EQ(r.pack, "");
  ASSERT_RC(bh_ledger_set_run(l, 3), -EINVAL);
  ASSERT_RC(bh_ledger_set_run(l, -1), -EINVAL);
  ASSERT_RC(bh_ledger_set_device(l, NULL), -EINVAL);
  bh_ledger_device d = {.device = ""};
  ASSERT_RC(bh_ledger_set_device(l, &d), -EINVAL);
  memset(d.device, 'x', sizeof d.device); /* unterminated */
  ASSERT_RC(bh_ledger_set_device(l, &d), -ENAMETOOLONG);
  bh_ledger_model m = {.id = 1};
  memset(m.name, 'x', sizeof m.name);
  ASSERT_RC(bh_ledger_set_model(l, &m), -ENAMETOOLONG);
  ASSERT_RC(bh_ledger_set_model(l, NULL), -EINVAL);
  ASSERT_RC(bh_ledger_snapshot(l, NULL, 1), -EINVAL);
  ASSERT_RC(bh_ledger_snapshot(l, NULL, -1), -EINVAL);
  ASSERT_EQ(bh_ledger_snapshot(l, NULL, 0), 0);
  ASSERT_RC(bh_ledger_read(l, 0, &r), -EINVAL);
  ASSERT_RC(bh_ledger_read(l, getpid(), NULL), -EINVAL);
  uint64_t a, b;
  ASSERT_RC(bh_ledger_model_read(l, getpid(), 1, NULL, NULL, &b), -EINVAL);
  ASSERT_RC(bh_ledger_model_read(l, -5, 1, NULL, &a, &b), -EINVAL);
  ASSERT_RC(bh_ledger_join(NULL, BH_ROLE_HOST, "", "", 0, 0), -EINVAL);
  ASSERT_RC(bh_ledger_leave(NULL), -EINVAL);
  ASSERT_RC(bh_ledger_set_run(NULL, 0), -EINVAL);
  ASSERT_RC(bh_ledger_reap(NULL), -EINVAL);
  ASSERT_NULL(bh_ledger_path(NULL));
  bh_ledger_close(l);
  ASSERT(!exists(p));
  return 0;
}

TEST_IMPL(ledger_join_leave) {
  char p[128];
  tpath(p, sizeof p, "join");
  bh_ledger *l;
  bh_ledger_record r;
  ASSERT_OK(bh_ledger_open(&l, p));
  ASSERT_RC(bh_ledger_slot(l), -BH_ENOTJOINED);
  ASSERT_RC(bh_ledger_leave(l), -BH_ENOTJOINED);
  ASSERT_RC(bh_ledger_set_run(l, BH_RUN_BUSY), -BH_ENOTJOINED);
  ASSERT_RC(bh_ledger_note_release(l, 1), -BH_ENOTJOINED);
  ASSERT_RC(bh_ledger_read(l, getpid(), &r), -ESRCH);
  int64_t before = bh_now_ns();
  int slot = bh_ledger_join(l, BH_ROLE_WORKER, "comfyui-pack", "3.12.1", 3, getppid());
  ASSERT_GE(slot, 0);
  ASSERT_EQ(bh_ledger_slot(l), slot);
  ASSERT_OK(bh_ledger_read(l, getpid(), &r));
  ASSERT_EQ(r.slot, slot);
  ASSERT_EQ(r.pid, getpid());
  uint64_t st;
  ASSERT_OK(bh__proc_start_time(getpid(), &st));
  ASSERT_UEQ(r.start_time, st);
  ASSERT_EQ(r.role, BH_ROLE_WORKER);
  ASSERT_EQ(r.generation, 3);
  ASSERT_EQ(r.host_pid, getppid());
  ASSERT_STR_EQ(r.pack, "comfyui-pack");
  ASSERT_STR_EQ(r.interpreter, "3.12.1");
  ASSERT_EQ(r.run, BH_RUN_IDLE);
  ASSERT_GE((int64_t)r.last_used_ns, before);
  ASSERT_EQ(r.n_devices, 0);
  ASSERT_EQ(r.n_models, 0);
  /* A second join refills the same record: never a duplicate. */
  bh_ledger_model m = {.id = 9, .name = "vae", .device = "cpu", .size_bytes = 10, .resident_bytes = 5};
  ASSERT_OK(bh_ledger_set_model(l, &m));
  ASSERT_EQ(bh_ledger_join(l, BH_ROLE_WORKER, "comfyui-pack", "3.12.1", 4, getppid()), slot);
  ASSERT_EQ(count_records(l), 1);
  ASSERT_OK(bh_ledger_read(l, getpid(), &r));
  ASSERT_EQ(r.generation, 4);
  ASSERT_EQ(r.n_models, 1); /* what the process holds is not forgotten */
  /* A second handle of the same process finds the same record. */
  bh_ledger *l2;
  ASSERT_OK(bh_ledger_open(&l2, p));
  ASSERT_EQ(bh_ledger_join(l2, BH_ROLE_WORKER, "comfyui-pack", "3.12.1", 4, getppid()), slot);
  ASSERT_EQ(count_records(l2), 1);
  /* One leaves: the other's writes now fail instead of writing a freed
   * (or someone else's) record. */
  ASSERT_OK(bh_ledger_leave(l2));
  ASSERT_RC(bh_ledger_set_run(l, BH_RUN_BUSY), -BH_ENOTJOINED);
  ASSERT_RC(bh_ledger_leave(l), -BH_ENOTJOINED);
  ASSERT_EQ(count_records(l), 0);
  bh_ledger_close(l2);
  ASSERT_RC(bh_ledger_read(l, getpid(), &r), -ESRCH);
  uint32_t v0, v1, v2;
  int hint = -1;
  ASSERT_RC(bh_ledger_version(l, getpid(), &hint, &v0), -ESRCH);
  ASSERT_EQ(hint, -1);
  ASSERT_RC(bh_ledger_version(l, getpid(), NULL, NULL), -EINVAL);
  ASSERT_RC(bh_ledger_version(l, 0, NULL, &v0), -EINVAL);
  ASSERT_RC(bh_ledger_version(NULL, getpid(), NULL, &v0), -EINVAL);
  /* Join again, set_run stamps the time, leave. */
  ASSERT_GE(bh_ledger_join(l, BH_ROLE_HOST, "", "3.11.9", 1, 0), 0);
  ASSERT_OK(bh_ledger_version(l, getpid(), &hint, &v0));
  ASSERT_EQ(hint, bh_ledger_slot(l));
  ASSERT_OK(bh_ledger_read(l, getpid(), &r));
  ASSERT_OK(bh_ledger_version(l, getpid(), &hint, &v1));
  ASSERT_EQ(v1, v0); /* a read changes nothing */
  ASSERT_EQ(v0 % 2, 0); /* not mid-write */
  uint64_t t0 = r.last_used_ns;
  bh_test_sleep_ms(2);
  ASSERT_OK(bh_ledger_set_run(l, BH_RUN_BUSY));
  ASSERT_OK(bh_ledger_version(l, getpid(), &hint, &v2));
  ASSERT_GT(v2, v1); /* every write moves it */
  ASSERT_OK(bh_ledger_version(l, getpid(), NULL, &v1));
  ASSERT_EQ(v1, v2);
  ASSERT_OK(bh_ledger_read(l, getpid(), &r));
  ASSERT_EQ(r.run, BH_RUN_BUSY);
  ASSERT_EQ(r.role, BH_ROLE_HOST);
  ASSERT_EQ(r.n_models, 0); /* a fresh record */
  ASSERT_GT(r.last_used_ns, t0);
  ASSERT_OK(bh_ledger_set_run(l, BH_RUN_RELEASING));
  ASSERT_OK(bh_ledger_leave(l));
  ASSERT_RC(bh_ledger_slot(l), -BH_ENOTJOINED);
  ASSERT_EQ(count_records(l), 0);
  bh_ledger_close(l);
  ASSERT(!exists(p));
  return 0;
}

TEST_IMPL(ledger_models_devices) {
  char p[128];
  tpath(p, sizeof p, "models");
  bh_ledger *l;
  bh_ledger_record r;
  uint64_t sz, res;
  int hint = -1;
  ASSERT_OK(bh_ledger_open(&l, p));
  ASSERT_RC(bh_ledger_model_read(l, getpid(), 1, &hint, &sz, &res), -ESRCH);
  ASSERT_EQ(hint, -1);
  int slot = bh_ledger_join(l, BH_ROLE_WORKER, "pack", "3.10.4", 1, 1);
  ASSERT_GE(slot, 0);
  ASSERT_RC(bh_ledger_model_read(l, getpid(), 1, &hint, &sz, &res), -ENOENT);
  ASSERT_EQ(hint, slot);

  bh_ledger_device d = {.device = "cuda:GPU-8f3a0000-1111-2222-3333-444455556666",
                        .held_bytes = 1, .pinned_bytes = 2, .pin_ceiling_bytes = 3,
                        .pager_bytes = 4, .floor_bytes = 5, .reserve_bytes = 6};
  ASSERT_OK(bh_ledger_set_device(l, &d));
  bh_ledger_model m = {.id = UINT64_MAX, .name = "unet", .device = "cuda:GPU-8f3a0000-1111-2222-3333-444455556666",
                       .size_bytes = 5ull << 30, .resident_bytes = 3ull << 30};
  ASSERT_OK(bh_ledger_set_model(l, &m));
  /* A model on a device without an entry adds one, with zero bytes. */
  bh_ledger_model c = {.id = 2, .name = "clip", .device = "cpu", .size_bytes = 100, .resident_bytes = 100};
  ASSERT_OK(bh_ledger_set_model(l, &c));
  bh_ledger_model n = {.id = 3, .name = "nowhere", .device = "", .size_bytes = 7};
  ASSERT_OK(bh_ledger_set_model(l, &n));
  ASSERT_OK(bh_ledger_read(l, getpid(), &r));
  ASSERT_EQ(r.n_devices, 2);
  ASSERT_STR_EQ(r.devices[0].device, d.device);
  ASSERT_UEQ(r.devices[0].held_bytes, 1);
  ASSERT_UEQ(r.devices[0].pinned_bytes, 2);
  ASSERT_UEQ(r.devices[0].pin_ceiling_bytes, 3);
  ASSERT_UEQ(r.devices[0].pager_bytes, 4);
  ASSERT_UEQ(r.devices[0].floor_bytes, 5);
  ASSERT_UEQ(r.devices[0].reserve_bytes, 6);
  ASSERT_STR_EQ(r.devices[1].device, "cpu");
  ASSERT_UEQ(r.devices[1].held_bytes, 0);
  ASSERT_EQ(r.n_models, 3);
  ASSERT_UEQ(r.models[0].id, UINT64_MAX);
  ASSERT_STR_EQ(r.models[0].name, "unet");
  ASSERT_STR_EQ(r.models[0].device, d.device);
  ASSERT_UEQ(r.models[0].size_bytes, 5ull << 30);
  ASSERT_UEQ(r.models[0].resident_bytes, 3ull << 30);
  ASSERT_STR_EQ(r.models[1].device, "cpu");
  ASSERT_STR_EQ(r.models[2].device, "");

  /* Replace by name / by id. */
  d.held_bytes = 1000;
  ASSERT_OK(bh_ledger_set_device(l, &d));
  m.resident_bytes = 0;
  ASSERT_OK(bh_ledger_set_model(l, &m));
  ASSERT_OK(bh_ledger_read(l, getpid(), &r));
  ASSERT_EQ(r.n_devices, 2);
  ASSERT_EQ(r.n_models, 3);
  ASSERT_UEQ(r.devices[0].held_bytes, 1000);
  ASSERT_UEQ(r.models[0].resident_bytes, 0);

  /* The fast path. */
  hint = -1;
  ASSERT_OK(bh_ledger_model_read(l, getpid(), UINT64_MAX, &hint, &sz, &res));
  ASSERT_EQ(hint, slot);
  ASSERT_UEQ(sz, 5ull << 30);
  ASSERT_UEQ(res, 0);
  ASSERT_OK(bh_ledger_model_read(l, getpid(), 2, &hint, &sz, &res));
  ASSERT_UEQ(sz, 100);
  ASSERT_OK(bh_ledger_model_read(l, getpid(), 2, NULL, &sz, &res));
  ASSERT_RC(bh_ledger_model_read(l, getpid(), 77, &hint, &sz, &res), -ENOENT);
  hint = 63; /* a stale hint costs a scan, not a wrong answer */
  ASSERT_OK(bh_ledger_model_read(l, getpid(), 2, &hint, &sz, &res));
  ASSERT_EQ(hint, slot);
  hint = 1000;
  ASSERT_OK(bh_ledger_model_read(l, getpid(), 2, &hint, &sz, &res));
  ASSERT_EQ(hint, slot);

  /* Drop: the last entry moves into the hole. */
  ASSERT_OK(bh_ledger_drop_model(l, UINT64_MAX));
  ASSERT_RC(bh_ledger_drop_model(l, UINT64_MAX), -ENOENT);
  ASSERT_RC(bh_ledger_model_read(l, getpid(), UINT64_MAX, &hint, &sz, &res), -ENOENT);
  ASSERT_OK(bh_ledger_read(l, getpid(), &r));
  ASSERT_EQ(r.n_models, 2);
  ASSERT_UEQ(r.models[0].id, 3);
  ASSERT_UEQ(r.models[1].id, 2);

  /* Releases. */
  ASSERT_OK(bh_ledger_note_release(l, 100));
  ASSERT_OK(bh_ledger_note_release(l, 23));
  ASSERT_OK(bh_ledger_read(l, getpid(), &r));
  ASSERT_UEQ(r.release_count, 2);
  ASSERT_UEQ(r.released_bytes, 123);

  /* Full: BH_LEDGER_MODELS models, BH_LEDGER_DEVICES devices. */
  for (uint64_t id = 100; r.n_models < BH_LEDGER_MODELS; id++) {
    bh_ledger_model x = {.id = id, .name = "x", .device = "cpu", .size_bytes = id};
    ASSERT_OK(bh_ledger_set_model(l, &x));
    ASSERT_OK(bh_ledger_read(l, getpid(), &r));
  }
  bh_ledger_model x = {.id = 5000, .name = "one too many", .device = "cpu"};
  ASSERT_RC(bh_ledger_set_model(l, &x), -BH_EMODELS);
  x.id = 2; /* replacing still works */
  ASSERT_OK(bh_ledger_set_model(l, &x));
  /* Room for cpu and 16 GPUs (the most one node carries, #9), then a
   * clear refusal. */
  ASSERT_GE(BH_LEDGER_DEVICES, 17);
  ASSERT_OK(bh_ledger_read(l, getpid(), &r));
  bh_ledger_device e = {.device = ""};
  for (int g = 2; r.n_devices < BH_LEDGER_DEVICES; g++) {
    snprintf(e.device, sizeof e.device, "cuda:%d", g);
    ASSERT_OK(bh_ledger_set_device(l, &e));
    ASSERT_OK(bh_ledger_read(l, getpid(), &r));
  }
  memcpy(e.device, "cuda:99", 8);
  ASSERT_RC(bh_ledger_set_device(l, &e), -BH_EMODELS);
  ASSERT_OK(bh_ledger_drop_model(l, 100));
  bh_ledger_model y = {.id = 6000, .name = "y", .device = "cuda:98"};
  ASSERT_RC(bh_ledger_set_model(l, &y), -BH_EMODELS); /* no device entry left */
  ASSERT_OK(bh_ledger_read(l, getpid(), &r));
  ASSERT_EQ(r.n_devices, BH_LEDGER_DEVICES);
  ASSERT_EQ(r.n_models, BH_LEDGER_MODELS - 1);
  bh_ledger_close(l);
  ASSERT(!exists(p));
  return 0;
}

/* A child that opens the ledger on its own, joins as a worker with a
 * model, tells the parent, and leaves when the parent closes `hold`. */
static void child_worker(const char *p, int ready, int hold, uint64_t model_id) {
  bh_ledger *l;
  ASSERT_OK(bh_ledger_open(&l, p));
  ASSERT_GE(bh_ledger_join(l, BH_ROLE_WORKER, "child-pack", "3.9.18", 7, getppid()), 0);
  bh_ledger_model m = {.id = model_id, .name = "child-model", .device = "cpu",
                       .size_bytes = 4096, .resident_bytes = 1024};
  ASSERT_OK(bh_ledger_set_model(l, &m));
  ASSERT_OK(bh_ledger_set_run(l, BH_RUN_BUSY));
  put_byte(ready);
  wait_eof(hold);
  bh_ledger_close(l);
  _exit(0);
}

TEST_IMPL(ledger_snapshot_child) {
  char p[128];
  tpath(p, sizeof p, "snap");
  int ready[2], hold[2];
  bh_ledger *l;
  ASSERT_OK(bh_ledger_open(&l, p));
  ASSERT_GE(bh_ledger_join(l, BH_ROLE_HOST, "", "3.12.1", 1, 0), 0);
  ASSERT_SYS(pipe2(ready, O_CLOEXEC));
  ASSERT_SYS(pipe2(hold, O_CLOEXEC));
  pid_t pid = fork();
  ASSERT_SYS(pid);
  if (pid == 0) {
    close(ready[0]), close(hold[1]);
    child_worker(p, ready[1], hold[0], 42);
  }
  close(ready[1]), close(hold[0]);
  get_byte(ready[0]);
  bh_ledger_record r[BH_LEDGER_SLOTS];
  int n = bh_ledger_snapshot(l, r, BH_LEDGER_SLOTS);
  ASSERT_EQ(n, 2);
  int c = r[0].pid == pid ? 0 : 1;
  ASSERT_EQ(r[c].pid, pid);
  ASSERT_EQ(r[1 - c].pid, getpid());
  ASSERT_EQ(r[c].role, BH_ROLE_WORKER);
  ASSERT_EQ(r[c].host_pid, getpid());
  ASSERT_STR_EQ(r[c].pack, "child-pack");
  ASSERT_STR_EQ(r[c].interpreter, "3.9.18");
  ASSERT_EQ(r[c].generation, 7);
  ASSERT_EQ(r[c].run, BH_RUN_BUSY);
  ASSERT_EQ(r[c].n_models, 1);
  ASSERT_STR_EQ(r[c].models[0].name, "child-model");
  ASSERT_STR_EQ(r[c].models[0].device, "cpu");
  /* max smaller than the count. */
  ASSERT_EQ(bh_ledger_snapshot(l, r, 1), 1);
  int hint = -1;
  uint64_t sz, res;
  ASSERT_OK(bh_ledger_model_read(l, pid, 42, &hint, &sz, &res));
  ASSERT_UEQ(sz, 4096);
  ASSERT_UEQ(res, 1024);
  bh_ledger_record one;
  ASSERT_OK(bh_ledger_read(l, pid, &one));
  ASSERT_STR_EQ(one.pack, "child-pack");
  /* The child leaves and exits. */
  close(hold[1]);
  reap(pid, 0);
  close(ready[0]);
  ASSERT_EQ(count_records(l), 1);
  ASSERT_RC(bh_ledger_model_read(l, pid, 42, &hint, &sz, &res), -ESRCH);
  ASSERT_RC(bh_ledger_read(l, pid, &one), -ESRCH);
  bh_ledger_close(l);
  ASSERT(!exists(p));
  return 0;
}

TEST_IMPL(ledger_reap_killed) {
  char p[128];
  tpath(p, sizeof p, "reap");
  int ready[2], hold[2];
  bh_ledger *l;
  ASSERT_OK(bh_ledger_open(&l, p));
  ASSERT_SYS(pipe2(ready, O_CLOEXEC));
  ASSERT_SYS(pipe2(hold, O_CLOEXEC));
  pid_t kids[3];
  for (int i = 0; i < 3; i++) {
    kids[i] = fork();
    ASSERT_SYS(kids[i]);
    if (kids[i] == 0) {
      close(ready[0]), close(hold[1]);
      child_worker(p, ready[1], hold[0], (uint64_t)i);
    }
  }
  close(ready[1]), close(hold[0]);
  for (int i = 0; i < 3; i++) get_byte(ready[0]);
  ASSERT_EQ(count_records(l), 3);
  /* Killed, not yet waited for (a zombie): its record goes already. */
  ASSERT_SYS(kill(kids[0], SIGKILL));
  for (int i = 0; i < 500; i++) {
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)kids[0]);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    ssize_t n = fd >= 0 ? read(fd, buf, sizeof buf - 1) : -1;
    if (fd >= 0) close(fd);
    if (n > 0) {
      buf[n] = 0;
      if (strstr(buf, ") Z ")) break;
    }
    bh_test_sleep_ms(2);
  }
  ASSERT_EQ(bh_ledger_reap(l), 1);
  ASSERT_EQ(bh_ledger_reap(l), 0);
  bh_ledger_record r;
  ASSERT_RC(bh_ledger_read(l, kids[0], &r), -ESRCH);
  reap(kids[0], -1);
  /* Killed and waited for: the pid is gone. */
  ASSERT_SYS(kill(kids[1], SIGKILL));
  reap(kids[1], -1);
  int hint = -1;
  uint64_t sz, res;
  /* The fast path does not judge liveness; read and snapshot do. */
  ASSERT_OK(bh_ledger_model_read(l, kids[1], 1, &hint, &sz, &res));
  ASSERT_RC(bh_ledger_read(l, kids[1], &r), -ESRCH);
  ASSERT_RC(bh_ledger_model_read(l, kids[1], 1, &hint, &sz, &res), -ESRCH);
  ASSERT_EQ(count_records(l), 1);

  /* A reused pid: a record with a live pid (ours, the runner's) but
   * another start time is a dead process's record. */
  uint64_t st;
  ASSERT_OK(bh__proc_start_time(getpid(), &st));
  ASSERT_OK(bh__ledger_forge(l, 60, getpid(), st + 1));
  ASSERT_OK(bh__ledger_forge(l, 61, getppid(), 0));
  ASSERT_OK(bh__ledger_forge(l, 62, kids[1], st)); /* a pid with no process */
  uint64_t pst;
  ASSERT_OK(bh__proc_start_time(getppid(), &pst));
  ASSERT_OK(bh__ledger_forge(l, 63, getppid(), pst)); /* a live one stays */
  ASSERT_EQ(bh_ledger_reap(l), 3);
  ASSERT_EQ(count_records(l), 2);
  /* A join never takes over the stale record of an earlier process with
   * our pid: it gets a fresh one. */
  ASSERT_OK(bh__ledger_forge(l, 60, getpid(), st + 1));
  int slot = bh_ledger_join(l, BH_ROLE_TOOL, "", "", 0, 0);
  ASSERT_GE(slot, 0);
  ASSERT_NE(slot, 60);
  ASSERT_EQ(bh_ledger_reap(l), 1);
  ASSERT_OK(bh_ledger_leave(l));
  ASSERT_OK(bh__ledger_forge(l, 63, 0, 0));
  ASSERT_EQ(bh_ledger_reap(l), 1);

  close(hold[1]);
  reap(kids[2], 0);
  close(ready[0]);
  ASSERT_EQ(count_records(l), 0);
  bh_ledger_close(l);
  ASSERT(!exists(p));
  return 0;
}

TEST_IMPL(ledger_robust_mutex) {
  char p[128];
  tpath(p, sizeof p, "robust");
  int ready[2];
  bh_ledger *l;
  ASSERT_OK(bh_ledger_open(&l, p));
  ASSERT_SYS(pipe2(ready, O_CLOEXEC));
  pid_t pid = fork();
  ASSERT_SYS(pid);
  if (pid == 0) {
    close(ready[0]);
    bh_ledger *c;
    ASSERT_OK(bh_ledger_open(&c, p));
    ASSERT_GE(bh_ledger_join(c, BH_ROLE_WORKER, "dies-holding-the-lock", "", 1, getppid()), 0);
    ASSERT_OK(bh__ledger_lock(c));
    put_byte(ready[1]);
    for (;;) pause();
  }
  close(ready[1]);
  get_byte(ready[0]);
  close(ready[0]);
  ASSERT_SYS(kill(pid, SIGKILL));
  reap(pid, -1);
  /* The lock is EOWNERDEAD: recovered, and the dead holder reaped. */
  int slot = bh_ledger_join(l, BH_ROLE_HOST, "", "", 1, 0);
  ASSERT_GE(slot, 0);
  ASSERT_EQ(count_records(l), 1);
  ASSERT_OK(bh__ledger_lock(l));
  bh__ledger_unlock(l);
  /* A thread-less second death while holding it, then a reap. */
  pid = fork();
  ASSERT_SYS(pid);
  if (pid == 0) {
    ASSERT_OK(bh__ledger_lock(l)); /* the inherited handle: same mutex */
    _exit(0);                      /* exits holding it */
  }
  reap(pid, 0);
  ASSERT_EQ(bh_ledger_reap(l), 0);
  ASSERT_OK(bh_ledger_leave(l));
  bh_ledger_close(l);
  ASSERT(!exists(p));
  return 0;
}

/* A holder that is stopped, not dead: nobody waits on it for long.  A
 * snapshot leaves the dead out without reaping, join fails -ETIMEDOUT,
 * and once the holder is killed everything works again.  The waits are
 * the product's, shortened (bh__ledger_lock_wait_ms, this test's process
 * only): without a bound they would never end. */
TEST_IMPL(ledger_stopped_holder) {
  char p[128];
  tpath(p, sizeof p, "stopped");
  int ready[2];
  bh_ledger *l;
  bh_ledger_record recs[4];
  bh__ledger_lock_wait_ms = 50;
  ASSERT_OK(bh_ledger_open(&l, p));
  ASSERT_GE(bh_ledger_join(l, BH_ROLE_HOST, "host", "", 1, 0), 0);
  /* A dead process's record, for the snapshot to leave out. */
  ASSERT_OK(bh__ledger_forge(l, 5, 0x7ffffff0, 1));
  ASSERT_SYS(pipe2(ready, O_CLOEXEC));
  pid_t pid = fork();
  ASSERT_SYS(pid);
  if (pid == 0) {
    close(ready[0]);
    ASSERT_OK(bh__ledger_lock(l)); /* the inherited handle: same mutex */
    put_byte(ready[1]);
    raise(SIGSTOP);
    for (;;) pause();
  }
  close(ready[1]);
  get_byte(ready[0]);
  close(ready[0]);
  int64_t t0 = bh_now_ns();
  ASSERT_EQ(bh_ledger_snapshot(l, recs, 4), 1); /* ours; the forged one left out */
  ASSERT_EQ(recs[0].pid, getpid());
  bh_ledger *other;
  ASSERT_OK(bh_ledger_open(&other, p));
  ASSERT_EQ(bh_ledger_join(other, BH_ROLE_TOOL, "", "", 0, 0), 0 - ETIMEDOUT);
  int64_t waited_ms = (bh_now_ns() - t0) / 1000000;
  ASSERT_LT(waited_ms, 3 * 2000 + 2000); /* two bounded waits, not forever */
  ASSERT_SYS(kill(pid, SIGKILL));
  reap(pid, -1);
  /* EOWNERDEAD recovered; the forged record reaped at last. */
  ASSERT_EQ(bh_ledger_reap(l), 1);
  ASSERT_EQ(bh_ledger_snapshot(other, recs, 4), 1);
  bh_ledger_close(other);
  ASSERT_OK(bh_ledger_leave(l));
  bh_ledger_close(l);
  ASSERT(!exists(p));
  return 0;
}

/* The writer: every device field and the model's size and resident bytes
 * carry the same counter, so any mix of two writes shows. */
static void seq_writer(const char *p, int ready, volatile sig_atomic_t *stop) {
  bh_ledger *l;
  (void)stop;
  ASSERT_OK(bh_ledger_open(&l, p));
  ASSERT_GE(bh_ledger_join(l, BH_ROLE_WORKER, "writer", "", 0, 0), 0);
  bh_ledger_device d = {.device = "cuda:0"};
  /* The first value already follows the pattern (resident == ~size). */
  bh_ledger_model m = {.id = 1, .name = "m", .device = "cuda:0", .resident_bytes = ~0ull};
  ASSERT_OK(bh_ledger_set_device(l, &d));
  ASSERT_OK(bh_ledger_set_model(l, &m));
  put_byte(ready);
  for (uint64_t k = 1;; k++) {
    uint64_t v = k * 0x9e3779b97f4a7c15ull;
    d.held_bytes = d.pinned_bytes = d.pin_ceiling_bytes = d.pager_bytes = d.floor_bytes =
        d.reserve_bytes = v;
    ASSERT_OK(bh_ledger_set_device(l, &d));
    m.size_bytes = v;
    m.resident_bytes = ~v;
    snprintf(m.name, sizeof m.name, "%016llx", (unsigned long long)v);
    ASSERT_OK(bh_ledger_set_model(l, &m));
  }
}

TEST_IMPL(ledger_seqlock_no_torn_reads) {
  char p[128];
  tpath(p, sizeof p, "seq");
  int ready[2];
  bh_ledger *l;
  ASSERT_OK(bh_ledger_open(&l, p));
  ASSERT_SYS(pipe2(ready, O_CLOEXEC));
  pid_t pid = fork();
  ASSERT_SYS(pid);
  if (pid == 0) {
    close(ready[0]);
    seq_writer(p, ready[1], NULL);
  }
  close(ready[1]);
  get_byte(ready[0]);
  close(ready[0]);
  long again = 0, changes = 0;
  uint64_t last = 0;
  int hint = -1;
  for (int i = 0; i < 100000; i++) {
    bh_ledger_record r;
    int rc = bh_ledger_read(l, pid, &r);
    if (rc == -EAGAIN) {
      again++;
      continue;
    }
    ASSERT_OK(rc);
    ASSERT_EQ(r.n_devices, 1);
    ASSERT_EQ(r.n_models, 1);
    bh_ledger_device *d = &r.devices[0];
    uint64_t v = d->held_bytes;
    if (d->pinned_bytes != v || d->pin_ceiling_bytes != v || d->pager_bytes != v ||
        d->floor_bytes != v || d->reserve_bytes != v)
      FAIL("torn device entry at read %d: %llx %llx %llx %llx %llx %llx", i,
           (unsigned long long)v, (unsigned long long)d->pinned_bytes,
           (unsigned long long)d->pin_ceiling_bytes, (unsigned long long)d->pager_bytes,
           (unsigned long long)d->floor_bytes, (unsigned long long)d->reserve_bytes);
    bh_ledger_model *m = &r.models[0];
    char want[32];
    snprintf(want, sizeof want, "%016llx", (unsigned long long)m->size_bytes);
    if (m->resident_bytes != ~m->size_bytes || (m->size_bytes && strcmp(m->name, want) != 0))
      FAIL("torn model entry at read %d: size %llx resident %llx name %s", i,
           (unsigned long long)m->size_bytes, (unsigned long long)m->resident_bytes, m->name);
    if (v != last) changes++, last = v;
    uint64_t sz, res;
    rc = bh_ledger_model_read(l, pid, 1, &hint, &sz, &res);
    if (rc == -EAGAIN) {
      again++;
      continue;
    }
    ASSERT_OK(rc);
    if (res != ~sz) FAIL("torn fast read at %d: size %llx resident %llx", i,
                         (unsigned long long)sz, (unsigned long long)res);
  }
  ASSERT_SYS(kill(pid, SIGKILL));
  reap(pid, -1);
  fprintf(stderr, "%ld distinct values seen, %ld reads gave up (EAGAIN)\n", changes, again);
  ASSERT_GT(changes, 10); /* the writer really was writing */
  ASSERT_LT(again, 1000);
  /* A writer killed mid-write (seq left odd) is reaped, never waited on. */
  ASSERT_EQ(count_records(l), 0);
  bh_ledger_close(l);
  ASSERT(!exists(p));
  return 0;
}

/* One record left mid-write by a live owner (stopped with its seqlock
 * odd) does not fail the snapshot (#11): every other record is read, and
 * that one comes back stale, with its slot and pid. */
TEST_IMPL(ledger_snapshot_skips_a_record_left_mid_write) {
  char p[128];
  tpath(p, sizeof p, "stale");
  int ready[2], hold[2];
  bh_ledger *l;
  ASSERT_OK(bh_ledger_open(&l, p));
  ASSERT_SYS(pipe2(ready, O_CLOEXEC));
  ASSERT_SYS(pipe2(hold, O_CLOEXEC));
  pid_t kid = fork();
  ASSERT_SYS(kid);
  if (kid == 0) {
    close(ready[0]), close(hold[1]);
    int slot = bh_ledger_join(l, BH_ROLE_WORKER, "stuck", "", 1, 0);
    if (slot < 0 || write(ready[1], &slot, sizeof slot) != sizeof slot) _exit(3);
    wait_eof(hold[0]);
    _exit(0);
  }
  close(ready[1]), close(hold[0]);
  int slot = -1;
  ASSERT_EQ(read(ready[0], &slot, sizeof slot), (ssize_t)sizeof slot);
  close(ready[0]);
  ASSERT_GE(slot, 0);
  ASSERT_GE(bh_ledger_join(l, BH_ROLE_HOST, "host", "", 1, 0), 0);
  /* The owner's seqlock left odd, as by a writer stopped mid-write. */
  int fd = open(p, O_RDWR | O_CLOEXEC);
  ASSERT_SYS(fd);
  size_t bytes = 4096 + (size_t)BH_LEDGER_SLOTS * 4384;
  uint8_t *map = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ASSERT(map != MAP_FAILED);
  close(fd);
  _Atomic uint32_t *seq = (_Atomic uint32_t *)(map + 4096 + (size_t)slot * 4384);
  uint32_t was = atomic_load(seq);
  atomic_store(seq, was | 1);
  bh_ledger_record recs[4];
  int n = bh_ledger_snapshot(l, recs, 4);
  ASSERT_EQ(n, 2);
  int saw_stale = 0, saw_host = 0;
  for (int i = 0; i < n; i++) {
    if (recs[i].slot == slot) {
      saw_stale = 1;
      ASSERT_EQ(recs[i].pid, kid);
      ASSERT_EQ(recs[i].run, BH_RUN_STALE);
    } else if (recs[i].pid == getpid()) {
      saw_host = 1;
      ASSERT_STR_EQ(recs[i].pack, "host");
    }
  }
  ASSERT(saw_stale && saw_host);
  atomic_store(seq, was);
  munmap(map, bytes);
  close(hold[1]);
  reap(kid, 0);
  bh_ledger_close(l);
  return 0;
}

/* The open/close file lock is waited for with a bound (#12), like the
 * mutex: a holder that stays (a stopped process) makes an open fail with
 * -ETIMEDOUT instead of hanging it. */
TEST_IMPL(ledger_open_lock_wait_is_bounded) {
  char p[128];
  tpath(p, sizeof p, "lockwait");
  bh_ledger *l, *l2 = NULL;
  bh__ledger_lock_wait_ms = 50; /* the bounded wait, shortened (this process only) */
  ASSERT_OK(bh_ledger_open(&l, p));
  int fd = open(p, O_RDWR | O_CLOEXEC);
  ASSERT_SYS(fd);
  struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET, .l_start = 0, .l_len = 1};
  ASSERT_SYS(fcntl(fd, F_OFD_SETLK, &fl)); /* INIT, held as a stopped opener would */
  ASSERT_RC(bh_ledger_open(&l2, p), -ETIMEDOUT);
  ASSERT(l2 == NULL);
  close(fd); /* let go: the next open goes through */
  ASSERT_OK(bh_ledger_open(&l2, p));
  bh_ledger_close(l2);
  bh_ledger_close(l);
  ASSERT(!exists(p));
  return 0;
}

TEST_IMPL(ledger_full) {
  char p[128];
  tpath(p, sizeof p, "full");
  int ready[2], hold[2];
  bh_ledger *l;
  pid_t kids[BH_LEDGER_SLOTS];
  ASSERT_OK(bh_ledger_open(&l, p));
  ASSERT_SYS(pipe2(ready, O_CLOEXEC));
  ASSERT_SYS(pipe2(hold, O_CLOEXEC));
  for (int i = 0; i < BH_LEDGER_SLOTS; i++) {
    kids[i] = fork();
    ASSERT_SYS(kids[i]);
    if (kids[i] == 0) {
      close(ready[0]), close(hold[1]);
      /* The inherited handle: a child may join through it. */
      if (bh_ledger_join(l, BH_ROLE_TOOL, "filler", "", 0, 0) < 0) _exit(3);
      put_byte(ready[1]);
      wait_eof(hold[0]);
      bh_ledger_close(l); /* leaves: the child joined through it */
      _exit(0);
    }
  }
  close(ready[1]), close(hold[0]);
  for (int i = 0; i < BH_LEDGER_SLOTS; i++) get_byte(ready[0]);
  ASSERT_EQ(count_records(l), BH_LEDGER_SLOTS);
  ASSERT_RC(bh_ledger_join(l, BH_ROLE_HOST, "", "", 0, 0), -BH_ELEDGERFULL);
  /* A full ledger reaps before it gives up. */
  ASSERT_SYS(kill(kids[17], SIGKILL));
  reap(kids[17], -1);
  int slot = bh_ledger_join(l, BH_ROLE_HOST, "", "", 0, 0);
  ASSERT_GE(slot, 0);
  ASSERT_EQ(count_records(l), BH_LEDGER_SLOTS);
  close(hold[1]);
  for (int i = 0; i < BH_LEDGER_SLOTS; i++)
    if (i != 17) reap(kids[i], 0);
  close(ready[0]);
  ASSERT_EQ(count_records(l), 1);
  bh_ledger_close(l);
  ASSERT(!exists(p));
  return 0;
}

TEST_IMPL(ledger_fork_child_not_owner) {
  char p[128];
  tpath(p, sizeof p, "fork");
  bh_ledger *l;
  ASSERT_OK(bh_ledger_open(&l, p));
  int slot = bh_ledger_join(l, BH_ROLE_HOST, "", "3.12.1", 1, 0);
  ASSERT_GE(slot, 0);
  bh_ledger_model m = {.id = 5, .name = "parent's", .device = "cpu", .size_bytes = 1};
  ASSERT_OK(bh_ledger_set_model(l, &m));
  pid_t parent = getpid();
  pid_t pid = fork();
  ASSERT_SYS(pid);
  if (pid == 0) {
    ASSERT_RC(bh_ledger_slot(l), -BH_ENOTJOINED);
    ASSERT_RC(bh_ledger_set_run(l, BH_RUN_BUSY), -BH_ENOTJOINED);
    ASSERT_RC(bh_ledger_set_model(l, &m), -BH_ENOTJOINED);
    ASSERT_RC(bh_ledger_drop_model(l, 5), -BH_ENOTJOINED);
    ASSERT_RC(bh_ledger_note_release(l, 1), -BH_ENOTJOINED);
    bh_ledger_device d = {.device = "cpu"};
    ASSERT_RC(bh_ledger_set_device(l, &d), -BH_ENOTJOINED);
    ASSERT_RC(bh_ledger_leave(l), -BH_ENOTJOINED);
    /* It still reads everything. */
    bh_ledger_record r;
    ASSERT_OK(bh_ledger_read(l, parent, &r));
    ASSERT_EQ(r.slot, slot);
    ASSERT_EQ(r.n_models, 1);
    /* Closing the copy neither leaves nor unlinks. */
    bh_ledger_close(l);
    _exit(0);
  }
  reap(pid, 0);
  ASSERT(exists(p));
  bh_ledger_record r;
  ASSERT_OK(bh_ledger_read(l, getpid(), &r));
  ASSERT_EQ(r.n_models, 1);
  ASSERT_OK(bh_ledger_set_run(l, BH_RUN_BUSY));
  ASSERT_EQ(count_records(l), 1);
  bh_ledger_close(l);
  ASSERT(!exists(p));
  return 0;
}

TEST_IMPL(ledger_last_leaver_unlinks) {
  char p[128];
  tpath(p, sizeof p, "last");
  bh_ledger *a, *b;
  /* Two handles of this process: the file stays while either is open. */
  ASSERT_OK(bh_ledger_open(&a, p));
  ASSERT_OK(bh_ledger_open(&b, p));
  ASSERT_GE(bh_ledger_join(a, BH_ROLE_HOST, "", "", 0, 0), 0);
  bh_ledger_close(a);
  ASSERT(exists(p));
  bh_ledger_close(b);
  ASSERT(!exists(p));

  /* Another process's open handle keeps it too. */
  int ready[2], hold[2];
  ASSERT_SYS(pipe2(ready, O_CLOEXEC));
  ASSERT_SYS(pipe2(hold, O_CLOEXEC));
  ASSERT_OK(bh_ledger_open(&a, p));
  pid_t pid = fork();
  ASSERT_SYS(pid);
  if (pid == 0) {
    close(ready[0]), close(hold[1]);
    bh_ledger *c;
    ASSERT_OK(bh_ledger_open(&c, p)); /* open only, no join */
    put_byte(ready[1]);
    wait_eof(hold[0]);
    bh_ledger_close(c);
    _exit(0);
  }
  close(ready[1]), close(hold[0]);
  get_byte(ready[0]);
  bh_ledger_close(a);
  ASSERT(exists(p));
  close(hold[1]);
  reap(pid, 0);
  close(ready[0]);
  ASSERT(!exists(p));

  /* A crashed process leaves the file and its record; the next process
   * that comes and goes reaps the record and removes the file. */
  ASSERT_SYS(pipe2(ready, O_CLOEXEC));
  pid = fork();
  ASSERT_SYS(pid);
  if (pid == 0) {
    close(ready[0]);
    bh_ledger *c;
    ASSERT_OK(bh_ledger_open(&c, p));
    ASSERT_GE(bh_ledger_join(c, BH_ROLE_WORKER, "crashes", "", 0, 0), 0);
    put_byte(ready[1]);
    for (;;) pause();
  }
  close(ready[1]);
  get_byte(ready[0]);
  close(ready[0]);
  ASSERT_SYS(kill(pid, SIGKILL));
  reap(pid, -1);
  ASSERT(exists(p));
  ASSERT_OK(bh_ledger_open(&a, p));
  bh_ledger_close(a);
  ASSERT(!exists(p));

  /* A file removed by someone else while open: a later opener makes a new
   * one, the old handle's close leaves it alone. */
  ASSERT_OK(bh_ledger_open(&a, p));
  ASSERT_SYS(unlink(p));
  ASSERT_OK(bh_ledger_open(&b, p));
  bh_ledger_close(a);
  ASSERT(exists(p));
  bh_ledger_close(b);
  ASSERT(!exists(p));
  return 0;
}

/* Openers and closers racing: every open succeeds, every join gets a
 * slot, and when the last one is gone so is the file. */
TEST_IMPL(ledger_open_close_race) {
  char p[128];
  tpath(p, sizeof p, "race");
  enum { KIDS = 6, ROUNDS = 150 };
  pid_t kids[KIDS];
  for (int i = 0; i < KIDS; i++) {
    kids[i] = fork();
    ASSERT_SYS(kids[i]);
    if (kids[i] == 0) {
      for (int k = 0; k < ROUNDS; k++) {
        bh_ledger *l;
        int rc = bh_ledger_open(&l, p);
        if (rc < 0) FAIL("round %d: open: %s", k, bh_strerror(rc));
        if (k % 2 && (rc = bh_ledger_join(l, BH_ROLE_TOOL, "race", "", (uint32_t)k, 0)) < 0)
          FAIL("round %d: join: %s", k, bh_strerror(rc));
        if (k % 3 == 0 && (rc = bh_ledger_snapshot(l, NULL, 0)) < 0)
          FAIL("round %d: snapshot: %s", k, bh_strerror(rc));
        bh_ledger_close(l);
      }
      _exit(0);
    }
  }
  for (int i = 0; i < KIDS; i++) reap(kids[i], 0);
  ASSERT(!exists(p));
  return 0;
}

TEST_IMPL(ledger_proc_start_time) {
  uint64_t st, st2;
  ASSERT_OK(bh__proc_start_time(getpid(), &st));
  ASSERT_GT(st, 0);
  ASSERT_OK(bh__proc_start_time(getpid(), &st2));
  ASSERT_UEQ(st, st2);
  /* A comm with spaces and parentheses, the way a hostile pack could
   * name its process. */
  int ready[2];
  ASSERT_SYS(pipe2(ready, O_CLOEXEC));
  pid_t pid = fork();
  ASSERT_SYS(pid);
  if (pid == 0) {
    close(ready[0]);
    prctl(PR_SET_NAME, "a) 1 2 (b) Z ", 0, 0, 0);
    uint64_t mine;
    ASSERT_OK(bh__proc_start_time(getpid(), &mine));
    ASSERT_EQ(write(ready[1], &mine, sizeof mine), (ssize_t)sizeof mine);
    for (;;) pause();
  }
  close(ready[1]);
  uint64_t theirs = 0;
  ASSERT_EQ(read(ready[0], &theirs, sizeof theirs), (ssize_t)sizeof theirs);
  close(ready[0]);
  char path[64], comm[64];
  snprintf(path, sizeof path, "/proc/%d/comm", (int)pid);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  ASSERT_SYS(fd);
  ssize_t n = read(fd, comm, sizeof comm - 1);
  close(fd);
  ASSERT_GT(n, 0);
  comm[n] = 0;
  ASSERT_STR_CONTAINS(comm, "a) 1 2 (b)");
  ASSERT_OK(bh__proc_start_time(pid, &st2));
  ASSERT_UEQ(st2, theirs);
  ASSERT(st2 >= st);
  kill(pid, SIGKILL);
  reap(pid, -1);
  ASSERT_RC(bh__proc_start_time(pid, &st2), -ESRCH);
  ASSERT_RC(bh__proc_start_time(0, &st2), -ESRCH);
  ASSERT_RC(bh__proc_start_time(getpid(), NULL), -EINVAL);
  return 0;
}
