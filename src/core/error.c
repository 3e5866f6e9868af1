/*
 * error.c -- names for error codes, and the few helpers every core file
 * uses (close, clock, die).  Error codes are one table in bulkhead.h
 * (BH_ERRNO_MAP); bh_strerror covers those and errno alike.
 */
#include "internal.h"

#include <signal.h>
#include <stdio.h>
#include <time.h>

const char *bh_strerror(int err) {
  if (err < 0) err = -err;
  switch (err) {
#define BH__ERR_STR(name, value, msg) case name: return msg;
    BH_ERRNO_MAP(BH__ERR_STR)
#undef BH__ERR_STR
  }
  return strerror(err);
}

const char *bh_errname(int err) {
  if (err < 0) err = -err;
  switch (err) {
#define BH__ERR_NAME(name, value, msg) case name: return #name;
    BH_ERRNO_MAP(BH__ERR_NAME)
#undef BH__ERR_NAME
  case ETIMEDOUT: return "ETIMEDOUT";
  case EINTR: return "EINTR";
  case EPIPE: return "EPIPE";
  case ENOENT: return "ENOENT";
  case EACCES: return "EACCES";
  case EINVAL: return "EINVAL";
  case ENOMEM: return "ENOMEM";
  case ECONNRESET: return "ECONNRESET";
  case ENOTSUP: return "ENOTSUP";
  case ENODATA: return "ENODATA";
  case ENOTUNIQ: return "ENOTUNIQ";
  case ERANGE: return "ERANGE";
  case ENOSPC: return "ENOSPC";
  case ENAMETOOLONG: return "ENAMETOOLONG";
  case ESRCH: return "ESRCH";
  case EAGAIN: return "EAGAIN";
  case EPERM: return "EPERM";
  case ELOOP: return "ELOOP";
  }
  return NULL;
}

void bh__die(const char *file, int line, const char *what) {
  fprintf(stderr, "bulkhead: %s:%d: can't happen: %s\n", file, line, what);
  abort();
}

void bh__close(int fd) {
  if (fd <= 2) {
    BH__UNREACHABLE("close of a stdio fd");
    return;
  }
  int saved = errno;
  close(fd);
  errno = saved;
}

int64_t bh_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}
