/*
 * status.c -- the status snapshot: what every bulkhead process on the
 * machine holds, read from the shared ledger, next to what each device
 * has (RAM through bh_ram_read, GPUs through NVML); `bulkhead status`,
 * `bulkhead top` and ComfyUI's GET /bulkhead/status all show it.
 *
 * A snapshot (bh_status_snap) is taken at one moment and rendered twice: as
 * a table for people and as one JSON document.  `top` takes one per
 * refresh.  Reading needs no host and no IPC: the ledger is a shared file
 * every process writes its own record into (see include/bulkhead/ledger.h);
 * the command opens it without joining it, so it never appears in its own
 * output.  A ledger file that does not exist is not created: nobody ever
 * joined, so there is nothing to show (exit 0).  Records of processes that
 * died are reaped by the snapshot on the way.
 *
 * Grouping.  A worker's record names its host (host_pid); each host is
 * followed by its workers.  Workers whose host has no live record, and
 * records of other roles, stand on their own.
 *
 * The JSON document (schema 1; ComfyUI's GET /bulkhead/status serves the
 * same, so fields are only ever added -- a change of meaning bumps
 * "schema").  Bytes are integers, strings are UTF-8 (bytes that are not
 * become U+FFFD), and absent values are null:
 *
 *   {"schema": 1,
 *    "ledger": "/dev/shm/bulkhead-1000/ledger",  the file read
 *    "ledger_present": true,                     false: no file, nobody joined
 *    "gpu_error": null | "no NVIDIA driver: ...",  why there are no GPU rows
 *    "ram_error": null | "...",                  why there is no cpu row
 *    "devices": [                                what each device has now
 *      {"device": "cpu", "total_bytes": N, "free_bytes": N,
 *       "source": "meminfo" | "cgroup",          cgroup: clamped to its limit
 *       "index": null, "uuid": null, "name": null},
 *      {"device": "cuda:0", ..., "source": "nvml",
 *       "index": 0, "uuid": "GPU-...", "name": "NVIDIA H200"}],
 *    "processes": [                              hosts, each followed by its workers
 *      {"pid": N, "role": "host" | "worker" | "tool" | "unknown",
 *       "pack": "...", "interpreter": "3.12.1", "generation": N,
 *       "host_pid": N | null,                    a worker's host
 *       "state": "idle" | "busy" | "releasing" | "stale" | "working" | "unknown",
 *                                                stale: left mid-write by its
 *                                                (stopped) owner, only pid known
 *       "idle_s": 12.345 | null,                 now - last use (CLOCK_MONOTONIC)
 *       "held_bytes": N,                         sum of devices[].held_bytes
 *       "devices": [{"device": "cpu", "held_bytes": N, "pinned_bytes": N,
 *                    "pin_ceiling_bytes": N, "pager_bytes": N,
 *                    "floor_bytes": N, "reserve_bytes": N}],
 *       "models": [{"id": N, "name": "...", "device": "cpu",
 *                   "size_bytes": N, "resident_bytes": N}],
 *       "release_count": N, "released_bytes": N}]}
 *
 * GPU rows are named "cuda:<NVML index>" (PCI bus order: CUDA's ordinal
 * when CUDA_DEVICE_ORDER=PCI_BUS_ID and CUDA_VISIBLE_DEVICES is unset);
 * match a process's device to a row by name, or by "uuid" for device names
 * of the form "cuda:GPU-...".
 */
#include "status.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

/* ------------------------------------------------------------ probes */

void bh_status_probes_open(bh_status_probes *p) {
  const char *lib = getenv("BULKHEAD_NVML_LIBRARY");
  char why[200];
  memset(p, 0, sizeof *p);
  why[0] = 0;
  int rc = bh_gpu_open_nvml(&p->gpu, lib && lib[0] ? lib : NULL, why, sizeof why);
  if (rc == -BH_ENODRIVER)
    snprintf(p->gpu_error, sizeof p->gpu_error, "no NVIDIA driver (%s)", why[0] ? why : bh_strerror(rc));
  else if (rc < 0)
    snprintf(p->gpu_error, sizeof p->gpu_error, "NVML failed: %s", why[0] ? why : bh_strerror(rc));
}

void bh_status_probes_close(bh_status_probes *p) {
  bh_gpu_close(p->gpu);
  p->gpu = NULL;
}

/* ---------------------------------------------------------- snapshot */

static void bh__probe_devices(bh_status_snap *s, const bh_status_probes *p) {
  bh_ram_reading ram;
  char why[200] = "";
  int rc = bh_ram_read(NULL, &ram, why, sizeof why);
  if (rc == 0) {
    bh_status_device *d = &s->devices[s->n_devices++];
    snprintf(d->device, sizeof d->device, "cpu");
    d->total_bytes = ram.total_bytes;
    d->free_bytes = ram.available_bytes;
    d->source = ram.limited ? "cgroup" : "meminfo";
    d->index = -1;
  } else {
    snprintf(s->ram_error, sizeof s->ram_error, "RAM probe failed: %s%s%s", bh_strerror(rc),
             why[0] ? ": " : "", why);
  }
  if (!p->gpu) {
    snprintf(s->gpu_error, sizeof s->gpu_error, "%s", p->gpu_error);
    return;
  }
  s->gpu_available = 1;
  int n = bh_gpu_count(p->gpu);
  for (int i = 0; i < n && s->n_devices < BH_STATUS_DEVICES_MAX; i++) {
    bh_gpu_memory m;
    bh_status_device *d = &s->devices[s->n_devices];
    memset(d, 0, sizeof *d);
    rc = bh_gpu_memory_read(p->gpu, i, &m);
    if (rc < 0) {
      snprintf(s->gpu_error, sizeof s->gpu_error, "cuda:%d: memory read failed: %s", i, bh_strerror(rc));
      continue;
    }
    snprintf(d->device, sizeof d->device, "cuda:%d", i);
    d->total_bytes = m.total_bytes;
    d->free_bytes = m.free_bytes;
    d->source = "nvml";
    d->index = i;
    if (bh_gpu_uuid(p->gpu, i, d->uuid, sizeof d->uuid) < 0) d->uuid[0] = 0;
    if (bh_gpu_name(p->gpu, i, d->name, sizeof d->name) < 0) d->name[0] = 0;
    s->n_devices++;
  }
}

int bh_status_snap_take(bh_status_snap *s, const char *ledger_path, bh_ledger *ledger,
                        const bh_status_probes *p) {
  bh_ledger *l = NULL;
  struct stat st;
  int rc = 0;
  memset(s, 0, sizeof *s);
  s->now_ns = bh_now_ns();
  if (ledger) ledger_path = bh_ledger_path(ledger);
  if (ledger_path) {
    if (strlen(ledger_path) >= sizeof s->ledger_path) return -ENAMETOOLONG;
    strcpy(s->ledger_path, ledger_path);
  } else {
    rc = bh_ledger_default_path(s->ledger_path, sizeof s->ledger_path);
    if (rc < 0) return rc;
  }
  if (p) bh__probe_devices(s, p);
  if (!ledger && lstat(s->ledger_path, &st) < 0 && errno == ENOENT) return 0; /* never create one */
  s->ledger_present = 1;
  s->records = calloc(BH_LEDGER_SLOTS, sizeof *s->records);
  if (!s->records) return -ENOMEM;
  if (!ledger) {
    rc = bh_ledger_open(&l, s->ledger_path);
    if (rc < 0) goto out;
  }
  /* -EAGAIN: an owner stayed mid-write past the retry budget; a writer
   * holds its seqlock for microseconds, so a second try is enough. */
  for (int tries = 0; tries < 5; tries++) {
    rc = bh_ledger_snapshot(ledger ? ledger : l, s->records, BH_LEDGER_SLOTS);
    if (rc != -EAGAIN) break;
  }
  if (rc < 0) goto out;
  s->n_records = rc;
  rc = 0;
out:
  bh_ledger_close(l);
  return rc;
}

void bh_status_snap_free(bh_status_snap *s) {
  free(s->records);
  s->records = NULL;
  s->n_records = 0;
}

uint64_t bh_status_record_held(const bh_ledger_record *r) {
  uint64_t sum = 0;
  for (uint32_t i = 0; i < r->n_devices && i < BH_LEDGER_DEVICES; i++) sum += r->devices[i].held_bytes;
  return sum;
}

const char *bh_status_role_name(int role) {
  return role == BH_ROLE_HOST ? "host" : role == BH_ROLE_WORKER ? "worker" : role == BH_ROLE_TOOL ? "tool" : "unknown";
}

const char *bh_status_run_name(int run) {
  return run == BH_RUN_IDLE ? "idle" : run == BH_RUN_BUSY ? "busy" : run == BH_RUN_RELEASING ? "releasing"
         : run == BH_RUN_STALE ? "stale" : run == BH_RUN_WORKING ? "working" : "unknown";
}

/* The host record a worker belongs under, or -1. */
static int bh__host_of(const bh_status_snap *s, const bh_ledger_record *r) {
  if (r->role != BH_ROLE_WORKER || r->host_pid <= 0) return -1;
  for (int i = 0; i < s->n_records; i++)
    if (s->records[i].role == BH_ROLE_HOST && s->records[i].pid == r->host_pid) return i;
  return -1;
}

/* Whether record u goes after record v by pid: ascending, except that a
 * worker whose host is gone comes after every host and tool (pids wrap, so
 * a pid alone would put it anywhere). */
static int bh__after_by_pid(const bh_status_snap *s, int u, int v) {
  int wu = s->records[u].role == BH_ROLE_WORKER, wv = s->records[v].role == BH_ROLE_WORKER;
  return wu != wv ? wu > wv : s->records[u].pid > s->records[v].pid;
}

/* Sorts idx[0..n) by key descending (by_held) or by pid ascending;
 * insertion sort: at most BH_LEDGER_SLOTS entries. */
static void bh__sort(const bh_status_snap *s, int *idx, const uint64_t *key, int n, int by_held) {
  for (int i = 1; i < n; i++) {
    int v = idx[i], j = i;
    while (j > 0) {
      int u = idx[j - 1];
      int after = by_held ? (key[u] < key[v] || (key[u] == key[v] && s->records[u].pid > s->records[v].pid))
                          : bh__after_by_pid(s, u, v);
      if (!after) break;
      idx[j] = u;
      j--;
    }
    idx[j] = v;
  }
}

int bh_status_snap_order(const bh_status_snap *s, int by_held, int *idx, int *depth) {
  int roots[BH_LEDGER_SLOTS], kids[BH_LEDGER_SLOTS], n_roots = 0, n = 0;
  uint64_t held[BH_LEDGER_SLOTS] = {0}, group[BH_LEDGER_SLOTS] = {0};
  int parent[BH_LEDGER_SLOTS];
  int count = s->n_records > BH_LEDGER_SLOTS ? BH_LEDGER_SLOTS : s->n_records;
  for (int i = 0; i < count; i++) {
    held[i] = group[i] = bh_status_record_held(&s->records[i]);
    parent[i] = bh__host_of(s, &s->records[i]);
  }
  for (int i = 0; i < count; i++) {
    if (parent[i] >= 0) group[parent[i]] += held[i];
    else roots[n_roots++] = i;
  }
  bh__sort(s, roots, group, n_roots, by_held);
  for (int r = 0; r < n_roots; r++) {
    int n_kids = 0;
    idx[n] = roots[r];
    depth[n++] = 0;
    for (int i = 0; i < count; i++)
      if (parent[i] == roots[r]) kids[n_kids++] = i;
    bh__sort(s, kids, held, n_kids, by_held);
    for (int k = 0; k < n_kids; k++) {
      idx[n] = kids[k];
      depth[n++] = 1;
    }
  }
  return n;
}

/* --------------------------------------------------------------- JSON */

static void bh__json_key_str(bh_buf *b, const char *key, const char *v, int comma) {
  bh_text_appendf(b, "%s\"%s\": ", comma ? ", " : "", key);
  if (v) bh_text_json_str(b, v, strlen(v));
  else bh_text_appendf(b, "null");
}

int bh_status_json(bh_buf *b, const bh_status_snap *s) {
  int idx[BH_LEDGER_SLOTS], depth[BH_LEDGER_SLOTS];
  bh_text_appendf(b, "{\"schema\": %d", BH_STATUS_JSON_SCHEMA);
  bh__json_key_str(b, "ledger", s->ledger_path, 1);
  bh_text_appendf(b, ", \"ledger_present\": %s", s->ledger_present ? "true" : "false");
  bh__json_key_str(b, "gpu_error", s->gpu_error[0] ? s->gpu_error : NULL, 1);
  bh__json_key_str(b, "ram_error", s->ram_error[0] ? s->ram_error : NULL, 1);
  bh_text_appendf(b, ", \"devices\": [");
  for (int i = 0; i < s->n_devices; i++) {
    const bh_status_device *d = &s->devices[i];
    bh_text_appendf(b, "%s{", i ? ", " : "");
    bh__json_key_str(b, "device", d->device, 0);
    bh_text_appendf(b, ", \"total_bytes\": %" PRIu64 ", \"free_bytes\": %" PRIu64, d->total_bytes,
                   d->free_bytes);
    bh__json_key_str(b, "source", d->source, 1);
    if (d->index >= 0) bh_text_appendf(b, ", \"index\": %d", d->index);
    else bh_text_appendf(b, ", \"index\": null");
    bh__json_key_str(b, "uuid", d->index >= 0 ? d->uuid : NULL, 1);
    bh__json_key_str(b, "name", d->index >= 0 ? d->name : NULL, 1);
    bh_text_appendf(b, "}");
  }
  bh_text_appendf(b, "], \"processes\": [");
  int n = bh_status_snap_order(s, 0, idx, depth);
  for (int k = 0; k < n; k++) {
    const bh_ledger_record *r = &s->records[idx[k]];
    bh_text_appendf(b, "%s{\"pid\": %d", k ? ", " : "", (int)r->pid);
    bh__json_key_str(b, "role", bh_status_role_name(r->role), 1);
    bh__json_key_str(b, "pack", r->pack, 1);
    bh__json_key_str(b, "interpreter", r->interpreter, 1);
    bh_text_appendf(b, ", \"generation\": %u", (unsigned)r->generation);
    if (r->host_pid > 0) bh_text_appendf(b, ", \"host_pid\": %d", (int)r->host_pid);
    else bh_text_appendf(b, ", \"host_pid\": null");
    bh__json_key_str(b, "state", bh_status_run_name(r->run), 1);
    if (r->last_used_ns == 0) {
      bh_text_appendf(b, ", \"idle_s\": null");
    } else {
      int64_t idle = s->now_ns - (int64_t)r->last_used_ns;
      bh_text_appendf(b, ", \"idle_s\": %.3f", idle > 0 ? (double)idle / 1e9 : 0.0);
    }
    bh_text_appendf(b, ", \"held_bytes\": %" PRIu64 ", \"devices\": [", bh_status_record_held(r));
    for (uint32_t i = 0; i < r->n_devices && i < BH_LEDGER_DEVICES; i++) {
      const bh_ledger_device *d = &r->devices[i];
      bh_text_appendf(b, "%s{", i ? ", " : "");
      bh__json_key_str(b, "device", d->device, 0);
      bh_text_appendf(b,
                     ", \"held_bytes\": %" PRIu64 ", \"pinned_bytes\": %" PRIu64
                     ", \"pin_ceiling_bytes\": %" PRIu64 ", \"pager_bytes\": %" PRIu64
                     ", \"floor_bytes\": %" PRIu64 ", \"reserve_bytes\": %" PRIu64 "}",
                     d->held_bytes, d->pinned_bytes, d->pin_ceiling_bytes, d->pager_bytes,
                     d->floor_bytes, d->reserve_bytes);
    }
    bh_text_appendf(b, "], \"models\": [");
    for (uint32_t i = 0; i < r->n_models && i < BH_LEDGER_MODELS; i++) {
      const bh_ledger_model *m = &r->models[i];
      bh_text_appendf(b, "%s{\"id\": %" PRIu64, i ? ", " : "", m->id);
      bh__json_key_str(b, "name", m->name, 1);
      bh__json_key_str(b, "device", m->device, 1);
      bh_text_appendf(b, ", \"size_bytes\": %" PRIu64 ", \"resident_bytes\": %" PRIu64 "}",
                     m->size_bytes, m->resident_bytes);
    }
    bh_text_appendf(b, "], \"release_count\": %" PRIu64 ", \"released_bytes\": %" PRIu64 "}",
                   r->release_count, r->released_bytes);
  }
  return bh_text_appendf(b, "]}\n");
}

/* -------------------------------------------------------------- text */

/* Ends the line begun at `start`: clipped to cols, then a newline. */
static void bh__line_end(bh_buf *b, size_t start, unsigned cols) {
  bh_text_line_clip(b, start, cols);
  bh_text_appendf(b, "\n");
}

void bh_status_wrapped(bh_buf *b, const char *label, const char *text, unsigned cols) {
  enum { INDENT = 11 };
  size_t room = cols > INDENT + 8 ? cols - INDENT : 8;
  size_t start = b->len;
  bh_text_appendf(b, "%-10s", label);
  const char *p = text;
  while (*p && !b->err) {
    while (*p == ' ') p++;
    const char *e = p;
    while (*e && *e != ' ') e++;
    size_t word = (size_t)(e - p);
    if (word == 0) break;
    size_t used = b->len - start;
    if (used > INDENT - 1 && used + 1 + (word < room ? word : room) > cols) {
      bh__line_end(b, start, cols);
      start = b->len;
      bh_text_appendf(b, "%*s", INDENT - 1, "");
      used = INDENT - 1;
    }
    size_t take = word;
    if (used + 1 + take > cols) take = cols - used - 1;   /* a word longer than a line: broken */
    bh_text_appendf(b, " %.*s", (int)take, p);
    p += take;
  }
  bh__line_end(b, start, cols);
}

/* Appends " <label> <bytes>" tokens to a detail line, wrapping onto a new
 * line (same indent) before one that would pass cols. */
static void bh__token(bh_buf *b, size_t *start, unsigned cols, unsigned indent, const char *tok) {
  size_t len = strlen(tok);
  if (b->err) return;
  if ((b->len - *start) + 2 + len > cols && b->len - *start > indent + 12) {
    bh__line_end(b, *start, cols);
    *start = b->len;
    bh_text_appendf(b, "%*s%-10s", (int)indent, "", "");
  }
  bh_text_appendf(b, "  %s", tok);
}

static void bh__process_details(bh_buf *b, const bh_status_snap *s, const bh_ledger_record *r,
                                unsigned cols) {
  enum { INDENT = 10 };
  char dev[4 * 10 + 1], name[4 * 22 + 1], x[16], y[16], tok[64];
  (void)s;
  for (uint32_t i = 0; i < r->n_devices && i < BH_LEDGER_DEVICES; i++) {
    const bh_ledger_device *d = &r->devices[i];
    size_t start = b->len;
    bh_text_fit(dev, sizeof dev, d->device, 10, 1);
    bh_text_bytes_format(d->held_bytes, x, sizeof x);
    bh_text_appendf(b, "%*s%s  held %s", INDENT, "", dev, x);
    if (d->pinned_bytes || d->pin_ceiling_bytes) {
      bh_text_bytes_format(d->pinned_bytes, x, sizeof x);
      bh_text_bytes_format(d->pin_ceiling_bytes, y, sizeof y);
      snprintf(tok, sizeof tok, "pinned %s of %s", x, y);
      bh__token(b, &start, cols, INDENT, tok);
    }
    const struct { const char *label; uint64_t v; } extra[] = {
        {"pager", d->pager_bytes}, {"floor", d->floor_bytes}, {"reserve", d->reserve_bytes}};
    for (size_t k = 0; k < sizeof extra / sizeof extra[0]; k++) {
      if (!extra[k].v) continue;
      bh_text_bytes_format(extra[k].v, x, sizeof x);
      snprintf(tok, sizeof tok, "%s %s", extra[k].label, x);
      bh__token(b, &start, cols, INDENT, tok);
    }
    bh__line_end(b, start, cols);
  }
  for (uint32_t i = 0; i < r->n_models && i < BH_LEDGER_MODELS; i++) {
    const bh_ledger_model *m = &r->models[i];
    size_t start = b->len;
    bh_text_fit(name, sizeof name, m->name, 22, 1);
    bh_text_fit(dev, sizeof dev, m->device[0] ? m->device : "-", 10, 1);
    bh_text_bytes_format(m->resident_bytes, x, sizeof x);
    bh_text_bytes_format(m->size_bytes, y, sizeof y);
    bh_text_appendf(b, "%*smodel %s %s %10s of %s", INDENT, "", name, dev, x, y);
    bh__line_end(b, start, cols);
  }
  if (r->release_count) {
    size_t start = b->len;
    bh_text_bytes_format(r->released_bytes, x, sizeof x);
    bh_text_appendf(b, "%*sreleased %" PRIu64 " time%s, %s in all", INDENT, "", r->release_count,
                   r->release_count == 1 ? "" : "s", x);
    bh__line_end(b, start, cols);
  }
}

/* The device table: one row per probed device, and why GPUs are missing. */
static void bh__device_rows(bh_buf *b, const bh_status_snap *s, unsigned cols) {
  char t[16], f[16], extra[4 * 48 + 1];
  size_t start = b->len;
  bh_text_appendf(b, "%-10s %10s %10s  %s", "DEVICE", "TOTAL", "FREE", "SOURCE");
  bh__line_end(b, start, cols);
  for (int i = 0; i < s->n_devices; i++) {
    const bh_status_device *d = &s->devices[i];
    start = b->len;
    bh_text_bytes_format(d->total_bytes, t, sizeof t);
    bh_text_bytes_format(d->free_bytes, f, sizeof f);
    bh_text_appendf(b, "%-10s %10s %10s  %s", d->device, t, f, d->source);
    if (d->index >= 0) {
      bh_text_fit(extra, sizeof extra, d->name, 20, 0);
      bh_text_appendf(b, "  %s", extra);
      bh_text_fit(extra, sizeof extra, d->uuid, 48, 0);
      bh_text_appendf(b, "  %s", extra);
    }
    bh__line_end(b, start, cols);
  }
  if (s->ram_error[0]) bh_status_wrapped(b, "cpu", s->ram_error, cols);
  if (!s->gpu_available || s->gpu_error[0]) {
    bh_status_wrapped(b, "gpu", s->gpu_error, cols);
  } else if (s->n_devices == (s->ram_error[0] ? 0 : 1)) {
    start = b->len;
    bh_text_appendf(b, "%-10s %s", "gpu", "NVML reports no devices");
    bh__line_end(b, start, cols);
  }
}

int bh_status_text(bh_buf *b, const bh_status_snap *s, unsigned cols) {
  int idx[BH_LEDGER_SLOTS], depth[BH_LEDGER_SLOTS];
  char pid[16], pack[4 * 18 + 1], py[4 * 8 + 1], idle[16], held[16];
  size_t start = b->len;
  bh_text_appendf(b, "ledger %s%s", s->ledger_path, s->ledger_present ? "" : " (none: nobody joined)");
  bh__line_end(b, start, cols);
  bh__device_rows(b, s, cols);
  bh_text_appendf(b, "\n");
  if (s->n_records == 0) {
    bh_text_appendf(b, "no bulkhead processes\n");
    return b->err;
  }
  start = b->len;
  bh_text_appendf(b, "%-9s %-7s %-18s %-8s %4s %-9s %7s %10s", "PID", "ROLE", "PACK", "PYTHON", "GEN",
                 "STATE", "IDLE", "HELD");
  bh__line_end(b, start, cols);
  int n = bh_status_snap_order(s, 0, idx, depth);
  for (int k = 0; k < n; k++) {
    const bh_ledger_record *r = &s->records[idx[k]];
    start = b->len;
    snprintf(pid, sizeof pid, "%s%d", depth[k] ? "  " : "", (int)r->pid);
    bh_text_fit(pack, sizeof pack, r->pack[0] ? r->pack : "-", 18, 1);
    bh_text_fit(py, sizeof py, r->interpreter[0] ? r->interpreter : "-", 8, 1);
    bh_text_idle_format(r->last_used_ns ? s->now_ns - (int64_t)r->last_used_ns : -1, idle, sizeof idle);
    bh_text_bytes_format(bh_status_record_held(r), held, sizeof held);
    bh_text_appendf(b, "%-9s %-7s %s %s %4u %-9s %7s %10s", pid, bh_status_role_name(r->role), pack, py,
                   (unsigned)r->generation, bh_status_run_name(r->run), idle, held);
    bh__line_end(b, start, cols);
    bh__process_details(b, s, r, cols);
  }
  return b->err;
}
