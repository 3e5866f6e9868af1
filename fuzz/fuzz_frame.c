/*
 * fuzz_frame.c -- the frame decoder on arbitrary messages.
 *
 * An input is one received seqpacket message and the number of fds that
 * came with it:
 *
 *   u8 n_fds (taken mod BH_FRAME_FDS_MAX + 1), then the message bytes
 *   (32-byte header, then the inline payload: block section + value).
 *
 * It goes through what bh_channel_recv runs on those bytes, the same
 * functions (src/core/channel.c): bh__frame_check (length, header,
 * fd count, inline length), bh__section_parse, then bh__section_apply
 * against a real pool, with real sealed memfds standing in for the intro
 * fds, and finally bh_dec_validate on the value that follows the section,
 * as every receiver does, and every tensor ref of the value (an ARRAY's
 * bytes too), in order,
 * through bh__lend_claim against the section's lend list (what
 * bh_channel_frame_block checks as the extension decodes: a block the
 * frame lends, an aligned offset, a range within the block, after the
 * previous ref into it), a back ref (BH_BLOCK_BACK) through
 * bh__pool_back_get against the pool's own block.  A SPILLED frame stops after the check: its
 * payload would be in the memfd, and the payload's decoders are the ones
 * fuzzed here on inline frames.
 *
 * An intro of an odd id gets a memfd sealed against writes (what a host
 * forwards from another worker, or a kept tensor's block: protocol 7), so
 * the pool maps it copy-on-write; the input then writes into that mapping
 * and drops it, and the memfd must still hold its owner's bytes (zeros).
 *
 * The pool lives across inputs with one own block (id 1) that is lent
 * before every input, so a return note can find it; every peer block an
 * input introduced is retired after it, so each input starts from the
 * same state (checked through bh_pool_stats_get).  The message is copied
 * to a buffer of its exact size so ASan catches a read past its end.
 */
#include "fuzz.h"
#include "src/core/internal.h"

#include <fcntl.h>
#include <sys/mman.h>

#define INTRO_BYTES 4096u

static bh_pool *pool;
static bh_block *own;  /* id 1, lent before each input */
static int intro_fd = -1; /* a sealed memfd; each intro gets a dup */
static int sealed_fd = -1; /* the same, sealed against writes too: odd ids' intros */

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc, (void)argv;
  void *addr = NULL;
  FUZZ_CHECK(bh__pool_open(&pool, 0, 0) == 0);
  FUZZ_CHECK(bh__pool_acquire(pool, INTRO_BYTES, &own) == 0);
  FUZZ_CHECK(bh_block_id(own) == 1);
  FUZZ_CHECK(bh__memfd_create("fuzz-intro", INTRO_BYTES, &intro_fd, &addr) == 0);
  munmap(addr, INTRO_BYTES);
  FUZZ_CHECK(bh__memfd_create("fuzz-sealed", INTRO_BYTES, &sealed_fd, NULL) == 0);
  FUZZ_CHECK(fcntl(sealed_fd, F_ADD_SEALS, F_SEAL_FUTURE_WRITE) == 0);
  return 0;
}

static void check_pool_at_rest(void) {
  bh_pool_stats s;
  FUZZ_CHECK(bh_pool_stats_get(pool, &s) == 0);
  FUZZ_CHECK(s.own_blocks == 1 && s.peer_blocks == 0 && s.peer_bytes == 0);
}

/* A back ref, against the pool's own block (id 1, lent unless the input
 * returned it): refused with BH_EBLOCK for any other id or a block not
 * lent, BH_ETENSOR for a range not aligned or not within it; else a
 * reference on that very block, the range within it. */
static void claim_back(const bh_tensor_ref *t) {
  bh_pool_stats s;
  FUZZ_CHECK(bh_pool_stats_get(pool, &s) == 0);
  uint32_t id = t->block & ~BH_BLOCK_BACK;
  bh_block *b = NULL;
  int rc = bh__pool_back_get(pool, t, &b);
  if (rc < 0) {
    FUZZ_RC_IN(rc, -BH_EBLOCK, -BH_ETENSOR);
    FUZZ_CHECK((rc == -BH_EBLOCK) == (id != 1 || s.lent_blocks == 0));
    return;
  }
  FUZZ_CHECK(b == own && id == 1 && s.lent_blocks == 1);
  FUZZ_CHECK(t->offset % BH_ARENA_ALIGN == 0 && t->offset <= bh_block_size(b) &&
             t->nbytes <= bh_block_size(b) - t->offset);
  fuzz_touch((const uint8_t *)bh_block_addr(b) + t->offset, (size_t)t->nbytes);
  bh_block_unref(b);
}

/* Every block ref of a valid value, in order, against the lend list: each
 * claim is refused with BH_EBLOCK / BH_ETENSOR or names an entry whose
 * block it is, the range aligned, within the block and after every range
 * claimed in it before. */
static void claim_refs(const bh__section *sec, const uint8_t *value, size_t len) {
  bh__lend *l = malloc(sizeof *l * (sec->n_lend ? sec->n_lend : 1));
  FUZZ_CHECK(l);
  bh__lend_load(sec, l);
  for (uint32_t i = 0; i < sec->n_lend; i++) FUZZ_CHECK(l[i].size > 0 && (i == 0 || l[i].id > l[i - 1].id));
  bh_reader r;
  bh_item it;
  bh_reader_init(&r, value, len);
  while (r.pos < r.len) {
    FUZZ_CHECK(bh_dec_next(&r, &it) == 0); /* the value validated */
    if ((it.tag != BH_TAG_TENSOR && it.tag != BH_TAG_ARRAY) || it.u.t.block == BH_BLOCK_NONE ||
        it.u.t.block == BH_BLOCK_INLINE)
      continue; /* an ARRAY's bytes are a tensor ref like any other */
    const bh_tensor_ref *t = &it.u.t;
    if (t->block & BH_BLOCK_BACK) { /* a back ref: our own block, lent */
      claim_back(t);
      continue;
    }
    uint32_t k = sec->n_lend;
    for (uint32_t i = 0; i < sec->n_lend; i++)
      if (l[i].id == t->block) k = i;
    uint64_t before = k < sec->n_lend ? l[k].end : 0;
    int rc = bh__lend_claim(l, sec->n_lend, t);
    if (rc < 0) {
      FUZZ_RC_IN(rc, -BH_EBLOCK, -BH_ETENSOR);
      FUZZ_CHECK((rc == -BH_EBLOCK) == (k == sec->n_lend));
      if (k < sec->n_lend) FUZZ_CHECK(l[k].end == before); /* a refused ref claims nothing */
      continue;
    }
    FUZZ_CHECK((uint32_t)rc == k);
    FUZZ_CHECK(t->offset % BH_ARENA_ALIGN == 0 && t->offset >= before);
    FUZZ_CHECK(t->nbytes <= l[k].size && t->offset <= l[k].size - t->nbytes);
    FUZZ_CHECK(l[k].end == t->offset + t->nbytes);
  }
  free(l);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size == 0) return 0;
  uint32_t n_fds = data[0] % (BH_FRAME_FDS_MAX + 1);
  size_t n = size - 1;
  uint8_t *msg = malloc(n ? n : 1);
  FUZZ_CHECK(msg);
  memcpy(msg, data + 1, n);

  bh_frame_header h;
  int rc = bh__frame_check(msg, n, n_fds, &h);
  if (rc) {
    FUZZ_RC_IN(rc, -BH_ESHORT, -BH_EMAGIC, -BH_EVERSION, -BH_EKIND, -BH_EHEADER, -BH_EFDCOUNT,
               -BH_E2BIG);
    goto out;
  }
  /* What the check promises. */
  FUZZ_CHECK(bh_frame_header_check(&h) == 0 && h.fd_count == n_fds);
  FUZZ_CHECK(bh_kind_name(h.kind) != NULL);
  if (h.flags & BH_FRAME_SPILLED) {
    FUZZ_CHECK(n == sizeof h && n_fds >= 1 && h.payload_bytes > 0);
    goto out;
  }
  FUZZ_CHECK(n - sizeof h == h.payload_bytes);

  const uint8_t *payload = msg + sizeof h;
  size_t payload_len = h.payload_bytes;
  bh__section sec;
  rc = bh__section_parse(payload, payload_len, n_fds, &sec);
  if (rc) {
    FUZZ_RC_IN(rc, -BH_EBLOCKSEC, -BH_EFDCOUNT);
    goto out;
  }
  FUZZ_CHECK(sec.n_intro == n_fds && sec.len <= payload_len);
  FUZZ_CHECK(sec.intro == payload + 16);
  FUZZ_CHECK(sec.lend + (size_t)sec.n_lend * 12 == payload + sec.len);
  fuzz_touch(payload, sec.len);

  /* Apply it as a channel would: the own block is out on loan. */
  int needs_fd = 0, fds[BH_FRAME_FDS_MAX];
  rc = bh__pool_lend(pool, own, &needs_fd);
  FUZZ_CHECK(rc == 0 || rc == -EBUSY); /* -EBUSY: the last input left it lent */
  for (uint32_t i = 0; i < sec.n_intro; i++) {
    int odd = bh__get_u32(sec.intro + (size_t)i * 12) & 1;
    fds[i] = fcntl(odd ? sealed_fd : intro_fd, F_DUPFD_CLOEXEC, 3);
    FUZZ_CHECK(fds[i] > 2);
  }
  rc = bh__section_apply(pool, &sec, fds);
  if (rc) FUZZ_RC_IN(rc, -BH_EBLOCK, -BH_EBLOCKSEC, -BH_ESEALS);
  for (uint32_t i = 0; i < sec.n_intro; i++) FUZZ_CHECK(fds[i] == -1); /* all consumed */
  /* The lend list against what is mapped now, as bh_channel_recv checks it. */
  if (sec.n_lend) {
    bh__lend *l = malloc(sizeof *l * sec.n_lend);
    FUZZ_CHECK(l);
    bh__lend_load(&sec, l);
    rc = bh__pool_peer_check(pool, l, sec.n_lend);
    if (rc) FUZZ_RC_IN(rc, -BH_EBLOCK);
    free(l);
  }
  /* Back to the resting state: no peer block stays mapped. */
  for (uint32_t i = 0; i < sec.n_intro; i++) {
    uint32_t id = bh__get_u32(sec.intro + (size_t)i * 12);
    bh_block *b;
    if (bh__pool_peer_get(pool, id, &b) == 0) {
      FUZZ_CHECK(bh_block_size(b) <= INTRO_BYTES && !bh_block_is_own(b));
      FUZZ_CHECK(b->private_map == (id & 1));
      fuzz_touch(bh_block_addr(b), bh_block_size(b));
      if (b->private_map) {
        /* Copy-on-write: the write stays in this mapping and is dropped
         * with the return (bh__range_clean finds it); the owner's bytes
         * do not change. */
        memset(bh_block_addr(b), 0xa5, bh_block_size(b));
        FUZZ_CHECK(bh__range_clean(bh_block_addr(b), bh_block_size(b)) == 0);
        uint8_t byte = 1;
        FUZZ_CHECK(pread(sealed_fd, &byte, 1, 0) == 1 && byte == 0);
      }
      bh_block_unref(b);
      /* The unref queued a return note; the peer would retire it. */
      uint32_t ret[64], retires[64], nr, nt;
      bh__pool_take_notes(pool, ret, &nr, retires, &nt, 64);
      FUZZ_CHECK(bh__pool_retire_peer(pool, id) == 0);
    }
  }
  check_pool_at_rest();

  /* The value after the section, as a receiver checks it. */
  rc = bh_dec_validate(payload + sec.len, payload_len - sec.len, BH_MAX_DEPTH);
  if (rc)
    FUZZ_RC_IN(rc, -BH_EOVERRUN, -BH_EBADTAG, -BH_EUTF8, -BH_ECOUNT, -BH_ETENSOR, -BH_EDTYPE,
               -BH_EDEPTH, -BH_ETRAILING, -BH_EBODY);
  else
    claim_refs(&sec, payload + sec.len, payload_len - sec.len);
out:
  free(msg);
  return 0;
}
