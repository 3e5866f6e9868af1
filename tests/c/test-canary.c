/*
 * test-canary.c -- the drift canary (tools/canary.c): its tokenizer, the
 * interface it derives from small model_management-like sources written
 * here (one per pattern upstream uses to read a ledger entry's patcher),
 * the is_dynamic() gating, call shapes against the StandIn's baseline,
 * the verdicts a removed / renamed member or a new keyword must produce,
 * bh_canary_main's exit statuses on files the tests write, and fuzzing:
 * random and mutated bytes and token soup must never crash, hang or read
 * outside the buffer (every input lives in a buffer of exactly its size,
 * so ASan sees an over-read).
 */
#include "task.h"

#include "canary.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>

/* ------------------------------------------------------------- helpers */

static bh_canary_report *analyze_without(const char *src, const char *const *without) {
  size_t n = strlen(src);
  char *copy = malloc(n ? n : 1); /* exactly n bytes: ASan sees an over-read */
  ASSERT_NOT_NULL(copy);
  memcpy(copy, src, n);
  bh_canary_report *r = NULL;
  ASSERT_OK(bh_canary_analyze(copy, n, without, &r));
  ASSERT_NOT_NULL(r);
  free(copy);
  return r;
}

static bh_canary_report *analyze(const char *src) { return analyze_without(src, NULL); }

static const char *class_name(int cls) {
  static const char *const names[] = {"answered", "lacking", "gated", "not member", "probed"};
  return cls >= 0 && cls < 5 ? names[cls] : "?";
}

/* The entry for name has class cls and its first use on line (0: any). */
#define ASSERT_NAME(r, nm, cls_, line_)                                          \
  do {                                                                          \
    const bh_canary_name *bh__n = bh_canary_report_find((r), (nm));             \
    if (!bh__n) FAIL("%s: not derived at all", (nm));                           \
    if ((int)bh__n->cls != (int)(cls_))                                         \
      FAIL("%s: %s, expected %s", (nm), class_name(bh__n->cls), class_name(cls_)); \
    int bh__l = bh__n->cls == BH_CANARY_GATED ? bh__n->gated_line : bh__n->line; \
    if ((line_) && bh__l != (line_)) FAIL("%s: first use on line %d, expected %d", (nm), bh__l, (int)(line_)); \
  } while (0)

#define ASSERT_ABSENT(r, nm)                                                    \
  do {                                                                          \
    if (bh_canary_report_find((r), (nm))) FAIL("%s: derived, expected nothing", (nm)); \
  } while (0)

/* The change for name, whose reason contains `why`. */
static const bh_canary_change *change_for(const bh_canary_report *r, const char *name, const char *why) {
  for (size_t i = 0; i < r->nchanges; i++)
    if (strcmp(r->changes[i].name, name) == 0 && strstr(r->changes[i].reason, why)) return &r->changes[i];
  return NULL;
}

static int unread(const bh_canary_report *r, const char *name) {
  for (size_t i = 0; i < r->nunread; i++)
    if (strcmp(r->unread[i], name) == 0) return 1;
  return 0;
}

/* The report as text (json 0) or JSON, in a malloc'ed string. */
static char *report_text(const bh_canary_report *r, int json) {
  char *buf = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&buf, &len);
  ASSERT_NOT_NULL(f);
  ASSERT_OK(bh_canary_report_write(r, "mm.py", json, f));
  ASSERT_EQ(fclose(f), 0);
  return buf;
}

/* A LoadedModel as upstream writes it: every read off self.model. */
#define LOADED_MODEL                                                                        \
  "import weakref\n"                                                                        \
  "current_loaded_models = []\n"                                                            \
  "\n"                                                                                      \
  "class LoadedModel:\n"                                                                    \
  "    def __init__(self, model):\n"                                                        \
  "        self._set_model(model)\n"                                                        \
  "        self.device = model.load_device\n"                /* 7 */                        \
  "        self.real_model = None\n"                                                        \
  "\n"                                                                                      \
  "    def _set_model(self, model):\n"                                                      \
  "        self._model = weakref.ref(model)\n"                                              \
  "        if model.parent is not None:\n"                   /* 12 */                       \
  "            self._parent_model = weakref.ref(model.parent)\n"                            \
  "\n"                                                                                      \
  "    @property\n"                                                                         \
  "    def model(self):\n"                                                                  \
  "        return self._model()\n"                                                          \
  "\n"                                                                                      \
  "    def model_memory(self):\n"                                                           \
  "        return self.model.model_size()\n"                 /* 20 */                       \
  "\n"                                                                                      \
  "    def model_offloaded_memory(self):\n"                                                 \
  "        return self.model.model_size() - self.model.loaded_size()\n" /* 23 */            \
  "\n"                                                                                      \
  "    def model_memory_required(self, device):\n"                                          \
  "        if device == self.model.current_loaded_device():\n" /* 26 */                     \
  "            return self.model_offloaded_memory()\n"                                      \
  "        return self.model_memory()\n"                                                    \
  "\n"                                                                                      \
  "    def model_load(self, lowvram_model_memory=0, force_patch_weights=False):\n"          \
  "        self.model.model_patches_to(self.device)\n"       /* 31 */                       \
  "        self.model.model_patches_to(self.model.model_dtype())\n" /* 32 */                \
  "        self.model_use_more_vram(lowvram_model_memory, force_patch_weights=force_patch_weights)\n" \
  "        real_model = self.model.model\n"                  /* 34 */                       \
  "        self.real_model = weakref.ref(real_model)\n"                                     \
  "        return real_model\n"                                                             \
  "\n"                                                                                      \
  "    def should_reload_model(self, force_patch_weights=False):\n"                         \
  "        return force_patch_weights and self.model.lowvram_patch_counter() > 0\n" /* 39 */\
  "\n"                                                                                      \
  "    def model_unload(self, memory_to_free=None, unpatch_weights=True):\n"                \
  "        if memory_to_free is not None:\n"                                                \
  "            if memory_to_free < self.model.loaded_size():\n"                             \
  "                freed = self.model.partially_unload(self.model.offload_device, memory_to_free)\n" /* 44 */ \
  "                if freed >= memory_to_free:\n"                                           \
  "                    return False\n"                                                      \
  "        self.model.detach(unpatch_weights)\n"             /* 47 */                       \
  "        return True\n"                                                                   \
  "\n"                                                                                      \
  "    def model_use_more_vram(self, extra_memory, force_patch_weights=False):\n"           \
  "        return self.model.partially_load(self.device, extra_memory, force_patch_weights=force_patch_weights)\n" /* 51 */ \
  "\n"                                                                                      \
  "    def __eq__(self, other):\n"                                                          \
  "        return self.model is other.model\n"                                              \
  "\n"

/* load_models_gpu (incoming models, aliases, clones) and the eviction
 * loop, lines 56 on. */
#define LOAD_AND_FREE                                                                       \
  "def free_memory(memory_required, device, keep_loaded=[], for_dynamic=False):\n"          \
  "    can_unload = []\n"                                                                   \
  "    for i in range(len(current_loaded_models) - 1, -1, -1):\n"                           \
  "        shift_model = current_loaded_models[i]\n"                                        \
  "        if shift_model.device == device:\n"               /* 60 */                       \
  "            can_unload.append((-shift_model.model_offloaded_memory(), i))\n"             \
  "    for x in sorted(can_unload):\n"                                                      \
  "        i = x[-1]\n"                                                                     \
  "        if current_loaded_models[i].model.is_dynamic() and for_dynamic:\n" /* 64 */      \
  "            memory_required -= current_loaded_models[i].model.loaded_size()\n"           \
  "            continue\n"                                                                  \
  "        logging.debug(f\"Unloading {current_loaded_models[i].model.model.__class__.__name__}\")\n" /* 67 */ \
  "        current_loaded_models[i].model_unload(memory_required)\n"                        \
  "\n"                                                                                      \
  "def load_models_gpu(models, memory_required=0, force_full_load=False):\n"  /* 70 */     \
  "    models_temp = set()\n"                                                               \
  "    for m in models:\n"                                                                  \
  "        models_temp.add(m)\n"                                                            \
  "        for mm in m.model_patches_models():\n"            /* 74 */                       \
  "            models_temp.add(mm)\n"                                                       \
  "    models = models_temp\n"                                                              \
  "    models_to_load = []\n"                                                               \
  "    for x in models:\n"                                                                  \
  "        loaded_model = LoadedModel(x)\n"                                                 \
  "        if hasattr(x, \"model\"):\n"                                                     \
  "            logging.info(f\"Requested to load {x.model.__class__.__name__}\")\n"          \
  "        models_to_load.append(loaded_model)\n"                                           \
  "    for loaded_model in models_to_load:\n"                                               \
  "        to_unload = []\n"                                                                \
  "        for i in range(len(current_loaded_models)):\n"                                   \
  "            if loaded_model.model.is_clone(current_loaded_models[i].model):\n" /* 86 */    \
  "                to_unload = [i] + to_unload\n"                                           \
  "        for i in to_unload:\n"                                                           \
  "            model_to_unload = current_loaded_models.pop(i)\n"                            \
  "            model_to_unload.model.detach(unpatch_all=False)\n" /* 90 */                  \
  "    for loaded_model in models_to_load:\n"                                               \
  "        model = loaded_model.model\n"                                                    \
  "        torch_dev = model.load_device\n"                  /* 93 */                       \
  "        loaded_model.model_load(0.1)\n"                                                  \
  "        current_loaded_models.insert(0, loaded_model)\n"                                 \
  "\n"

/* unload_model_and_clones, lines 97 on. */
#define UNLOAD_CLONES                                                                       \
  "def unload_model_and_clones(model, unload_additional_models=True):\n"                    \
  "    extras = model.get_nested_additional_models() if unload_additional_models else []\n" /* 98 */ \
  "    targets = [model.clone_base_uuid] + [m.clone_base_uuid for m in extras]\n" /* 99 */  \
  "    keep_loaded = []\n"                                                                  \
  "    for entry in current_loaded_models.copy():\n"                                        \
  "        if entry.model is not None and entry.model.clone_base_uuid in targets:\n"        \
  "            continue\n"                                                                  \
  "        keep_loaded.append(entry)\n"                                                     \
  "    free_memory(1e30, model.load_device, keep_loaded)\n"                                 \
  "\n"

#define FULL LOADED_MODEL LOAD_AND_FREE UNLOAD_CLONES

/* ----------------------------------------------------------- tokenizer */

static size_t tok_find(const bh_canary_token *t, size_t n, const char *src, const char *text, size_t from) {
  size_t len = strlen(text);
  for (size_t i = from; i < n; i++)
    if (t[i].len == len && memcmp(src + t[i].off, text, len) == 0) return i;
  FAIL("no token \"%s\"", text);
}

TEST_IMPL(canary_tokenize_basics) {
  const char *src =
      "def f(a,\n"                 /* 1: brackets span lines: no NEWLINE */
      "      b):  # comment ( [\n" /* 2 */
      "\tx = '''one\n"            /* 3: tab = column 8 */
      "two''' + \"q\\\"s\"\n"      /* 4 */
      "        y = 1 + \\\n"       /* 5: continuation */
      "            2e-3\n"         /* 6 */
      "\n"                         /* 7: blank */
      "        # only a comment\n" /* 8 */
      "        z = f'{a.b!r:>{w}} {{no}}' rb'\\''\n" /* 9 */
      "    return\n";              /* 10 */
  bh_canary_token *t = NULL;
  size_t n = 0;
  ASSERT_OK(bh_canary_tokenize(src, strlen(src), &t, &n));
  ASSERT_EQ(t[n - 1].kind, BH_TOK_END);
  int newlines = 0;
  for (size_t i = 0; i < n; i++) newlines += t[i].kind == BH_TOK_NEWLINE;
  ASSERT_EQ(newlines, 5); /* def, x, y, z, return */

  size_t d = tok_find(t, n, src, "def", 0);
  ASSERT_EQ(t[d].indent, 0);
  size_t b = tok_find(t, n, src, "b", 0);
  ASSERT_EQ(t[b].line, 2);
  ASSERT_EQ(t[b].indent, -1);
  size_t x = tok_find(t, n, src, "x", 0);
  ASSERT_EQ(t[x].line, 3);
  ASSERT_EQ(t[x].indent, 8);
  ASSERT_EQ(t[x + 2].kind, BH_TOK_STRING);
  ASSERT_EQ(t[x + 2].len, strlen("'''one\ntwo'''"));
  ASSERT_EQ(t[x + 4].kind, BH_TOK_STRING); /* "q\"s" is one string */
  ASSERT_EQ(t[x + 4].len, 6);
  ASSERT_EQ(t[x + 5].kind, BH_TOK_NEWLINE);
  size_t y = tok_find(t, n, src, "y", 0);
  ASSERT_EQ(t[y].line, 5);
  ASSERT_EQ(t[y].indent, 8);
  size_t num = tok_find(t, n, src, "2e-3", 0);
  ASSERT_EQ(t[num].kind, BH_TOK_NUMBER);
  ASSERT_EQ(t[num].line, 6);
  ASSERT_EQ(t[num + 1].kind, BH_TOK_NEWLINE);

  /* The f-string is one STRING token, then its fields' tokens: a.b (and
   * its conversion skipped) with the nested spec field {w}; the doubled
   * braces are text. */
  size_t z = tok_find(t, n, src, "z", 0);
  ASSERT_EQ(t[z].line, 9);
  ASSERT_EQ(t[z + 2].kind, BH_TOK_STRING);
  ASSERT_EQ(t[z + 2].len, strlen("f'{a.b!r:>{w}} {{no}}'"));
  ASSERT_EQ(t[z + 3].kind, BH_TOK_FOPEN);
  ASSERT_EQ(t[z + 4].kind, BH_TOK_NAME); /* a */
  ASSERT_EQ(t[z + 5].kind, BH_TOK_OP);   /* . */
  ASSERT_EQ(t[z + 6].kind, BH_TOK_NAME); /* b */
  ASSERT_EQ(t[z + 7].kind, BH_TOK_FOPEN);
  ASSERT_EQ(t[z + 8].kind, BH_TOK_NAME); /* w */
  ASSERT_EQ(t[z + 9].kind, BH_TOK_FCLOSE);
  ASSERT_EQ(t[z + 10].kind, BH_TOK_FCLOSE);
  ASSERT_EQ(t[z + 11].kind, BH_TOK_STRING); /* rb'\'' */
  ASSERT_EQ(t[z + 11].len, 6);
  ASSERT_EQ(t[z + 12].kind, BH_TOK_NEWLINE);
  size_t r = tok_find(t, n, src, "return", 0);
  ASSERT_EQ(t[r].line, 10);
  ASSERT_EQ(t[r].indent, 4);
  free(t);

  /* Unterminated strings end with their line; an unterminated triple
   * string or field with the input. */
  const char *bad[] = {"x = 'abc\ny = 1\n", "x = '''abc\n", "x = f'{a\ny\n", "f\"{", "\\", "'", "(((", ")))"};
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    ASSERT_OK(bh_canary_tokenize(bad[i], strlen(bad[i]), &t, &n));
    ASSERT_EQ(t[n - 1].kind, BH_TOK_END);
    free(t);
  }
  ASSERT_OK(bh_canary_tokenize("x = 'abc\ny = 1\n", 15, &t, &n));
  ASSERT_EQ(t[4].kind, BH_TOK_NAME); /* y, on its own line */
  ASSERT_EQ(t[4].line, 2);
  free(t);

  ASSERT_RC(bh_canary_tokenize(NULL, 1, &t, &n), -EINVAL);
  ASSERT_RC(bh_canary_tokenize("x", 1, NULL, &n), -EINVAL);
  ASSERT_RC(bh_canary_tokenize("x", (size_t)BH_CANARY_MAX_SOURCE + 1, &t, &n), -EFBIG);
  ASSERT_OK(bh_canary_tokenize(NULL, 0, &t, &n));
  ASSERT_EQ(n, 1);
  free(t);
  return 0;
}

/* ---------------------------------------------------- derived patterns */

/* LoadedModel's self.model.<name>, incl. the parameter reads in __init__
 * and _set_model; the inner module is not a member. */
TEST_IMPL(canary_direct_model_access) {
  bh_canary_report *r = analyze(LOADED_MODEL);
  ASSERT_NAME(r, "load_device", BH_CANARY_ANSWERED, 7);
  ASSERT_NAME(r, "parent", BH_CANARY_ANSWERED, 12);
  ASSERT_NAME(r, "model_size", BH_CANARY_ANSWERED, 20);
  ASSERT_NAME(r, "loaded_size", BH_CANARY_ANSWERED, 23);
  ASSERT_NAME(r, "current_loaded_device", BH_CANARY_ANSWERED, 26);
  ASSERT_NAME(r, "model_patches_to", BH_CANARY_ANSWERED, 31);
  ASSERT_NAME(r, "model_dtype", BH_CANARY_ANSWERED, 32);
  ASSERT_NAME(r, "lowvram_patch_counter", BH_CANARY_ANSWERED, 39);
  ASSERT_NAME(r, "partially_unload", BH_CANARY_ANSWERED, 44);
  ASSERT_NAME(r, "offload_device", BH_CANARY_ANSWERED, 44);
  ASSERT_NAME(r, "detach", BH_CANARY_ANSWERED, 47);
  ASSERT_NAME(r, "partially_load", BH_CANARY_ANSWERED, 51);
  ASSERT_NAME(r, "model", BH_CANARY_NOT_MEMBER, 34);
  ASSERT_STR_CONTAINS(bh_canary_report_find(r, "model")->why, "inner module");
  /* LoadedModel's own members and the entry's weakref are not the patcher's. */
  ASSERT_ABSENT(r, "_model");
  ASSERT_ABSENT(r, "model_offloaded_memory");
  ASSERT_ABSENT(r, "device");
  ASSERT_ABSENT(r, "ref");
  /* Call shapes as written. */
  const bh_canary_name *pl = bh_canary_report_find(r, "partially_load");
  ASSERT_EQ(pl->nshapes, 1);
  ASSERT_EQ(pl->shapes[0].positional, 2);
  ASSERT_STR_EQ(pl->shapes[0].keywords, "force_patch_weights");
  ASSERT_EQ(pl->uses, BH_CANARY_CALL);
  ASSERT_EQ(bh_canary_report_find(r, "offload_device")->uses, BH_CANARY_READ);
  ASSERT_EQ(r->nchanges, 0);
  ASSERT_EQ(bh_canary_report_status(r), 0);
  ASSERT(unread(r, "is_clone"));
  bh_canary_report_free(r);

  /* A dunder read off the patcher itself is not a member either. */
  r = analyze("p = current_loaded_models[0].model\n"
              "name = p.__class__.__name__\n");
  ASSERT_NAME(r, "__class__", BH_CANARY_NOT_MEMBER, 2);
  ASSERT_EQ(bh_canary_report_status(r), 0);
  bh_canary_report_free(r);
  return 0;
}

/* model = x.model, then model.<name>: within its function only, and
 * until rebound. */
TEST_IMPL(canary_alias_through_local) {
  const char *src =
      "def a():\n"
      "    for x in current_loaded_models:\n"
      "        m = x.model\n"
      "        m.aliased_read\n"                 /* 4 */
      "        m = None\n"
      "        m.after_rebind\n"
      "def b():\n"
      "    m.other_function\n"
      "    p = current_loaded_models[0].model\n"
      "    q = p\n"
      "    q.alias_of_alias()\n"                 /* 11 */
      "    n: LoadedModel = current_loaded_models[1]\n"
      "    n.model.annotated_entry\n"            /* 13 */
      "    r, s = p, p\n"
      "    r.tuple_target\n"
      "    def inner():\n"
      "        q.closure_read\n"                 /* 17 */
      "    q.after_inner\n";                     /* 18 */
  bh_canary_report *r = analyze(src);
  ASSERT_NAME(r, "aliased_read", BH_CANARY_LACKING, 4);
  ASSERT_NAME(r, "alias_of_alias", BH_CANARY_LACKING, 11);
  ASSERT_NAME(r, "annotated_entry", BH_CANARY_LACKING, 13);
  ASSERT_NAME(r, "closure_read", BH_CANARY_LACKING, 17);
  ASSERT_NAME(r, "after_inner", BH_CANARY_LACKING, 18);
  ASSERT_ABSENT(r, "after_rebind");
  ASSERT_ABSENT(r, "other_function");
  ASSERT_ABSENT(r, "tuple_target");
  ASSERT_EQ(bh_canary_report_status(r), 1);
  bh_canary_report_free(r);
  return 0;
}

/* Entries from current_loaded_models: loop variables, enumerate, sorted,
 * subscripts, pop, copy, comprehensions, lists that are appended to. */
TEST_IMPL(canary_loop_variable) {
  const char *src =
      "def f():\n"
      "    for x in current_loaded_models:\n"
      "        x.model.loop_var\n"                                 /* 3 */
      "    for i, e in enumerate(current_loaded_models):\n"
      "        e.model.enumerated\n"                               /* 5 */
      "        i.model\n"
      "    for e in reversed(current_loaded_models.copy()):\n"
      "        e.model.reversed_copy\n"                            /* 8 */
      "    sizes = [y.model.in_comprehension() for y in current_loaded_models]\n" /* 9 */
      "    total = sum(z.model.in_generator for z in current_loaded_models[1:])\n" /* 10 */
      "    e = current_loaded_models.pop(0)\n"
      "    e.model.popped\n"                                       /* 12 */
      "    keep = []\n"
      "    keep.append(current_loaded_models[0])\n"
      "    for k in keep:\n"
      "        k.model.appended\n"                                 /* 16 */
      "    for w in can_unload:\n"
      "        w.not_an_entry\n";
  bh_canary_report *r = analyze(src);
  ASSERT_NAME(r, "loop_var", BH_CANARY_LACKING, 3);
  ASSERT_NAME(r, "enumerated", BH_CANARY_LACKING, 5);
  ASSERT_NAME(r, "reversed_copy", BH_CANARY_LACKING, 8);
  ASSERT_NAME(r, "in_comprehension", BH_CANARY_LACKING, 9);
  ASSERT_NAME(r, "in_generator", BH_CANARY_LACKING, 10);
  ASSERT_NAME(r, "popped", BH_CANARY_LACKING, 12);
  ASSERT_NAME(r, "appended", BH_CANARY_LACKING, 16);
  ASSERT_ABSENT(r, "not_an_entry");
  ASSERT_EQ(r->nnames, 7);
  bh_canary_report_free(r);
  return 0;
}

/* load_models_gpu: members read off the incoming models, off
 * loaded_model.model and through the alias; x.model there is the inner
 * module, and hasattr(x, "model") a probe. */
TEST_IMPL(canary_incoming_models) {
  bh_canary_report *r = analyze(LOADED_MODEL LOAD_AND_FREE);
  ASSERT_NAME(r, "model_patches_models", BH_CANARY_ANSWERED, 74);
  ASSERT_NAME(r, "is_clone", BH_CANARY_ANSWERED, 86);
  const bh_canary_name *ic = bh_canary_report_find(r, "is_clone");
  ASSERT_EQ(ic->nshapes, 1);
  ASSERT_EQ(ic->shapes[0].positional, 1);
  const bh_canary_name *d = bh_canary_report_find(r, "detach");
  ASSERT_EQ(d->nshapes, 2); /* detach(unpatch_weights), detach(unpatch_all=False) */
  ASSERT_STR_EQ(d->shapes[1].keywords, "unpatch_all");
  ASSERT_EQ(d->shapes[1].line, 90);
  ASSERT_NAME(r, "load_device", BH_CANARY_ANSWERED, 7);
  ASSERT_EQ(bh_canary_report_find(r, "load_device")->uses, BH_CANARY_READ);
  /* Only through the alias in load_models_gpu: */
  bh_canary_report_free(r);
  r = analyze(LOAD_AND_FREE); /* lines 55 less than in FULL */
  ASSERT_NAME(r, "load_device", BH_CANARY_ANSWERED, 93 - 55);
  ASSERT_NAME(r, "is_dynamic", BH_CANARY_ANSWERED, 64 - 55);
  ASSERT_ABSENT(r, "__class__"); /* read off the inner module, not the patcher */
  ASSERT_NAME(r, "model", BH_CANARY_NOT_MEMBER, 67 - 55);
  ASSERT_EQ(bh_canary_report_find(r, "model")->uses, BH_CANARY_READ | BH_CANARY_PROBE);
  ASSERT_EQ(bh_canary_report_status(r), 0);
  bh_canary_report_free(r);

  /* A member read off an incoming model the StandIn lacks. */
  r = analyze("def load_models_gpu(requested, memory_required=0):\n"
              "    for m in requested:\n"
              "        if m.wants_pins():\n"
              "            pass\n");
  ASSERT_NAME(r, "wants_pins", BH_CANARY_LACKING, 3);
  ASSERT_EQ(bh_canary_report_status(r), 1);
  bh_canary_report_free(r);
  return 0;
}

TEST_IMPL(canary_unload_model_and_clones) {
  bh_canary_report *r = analyze(UNLOAD_CLONES);
  ASSERT_NAME(r, "get_nested_additional_models", BH_CANARY_ANSWERED, 2);
  ASSERT_NAME(r, "clone_base_uuid", BH_CANARY_ANSWERED, 3);
  ASSERT_NAME(r, "load_device", BH_CANARY_ANSWERED, 9);
  bh_canary_report_free(r);
  r = analyze(FULL);
  ASSERT_NAME(r, "get_nested_additional_models", BH_CANARY_ANSWERED, 98);
  ASSERT_NAME(r, "clone_base_uuid", BH_CANARY_ANSWERED, 99);
  /* Everything the StandIn answers is read in FULL; it covers it all. */
  ASSERT_EQ(r->nunread, 0);
  ASSERT_EQ(r->nanswered, 17);
  ASSERT_EQ(r->nlacking, 0);
  ASSERT_EQ(r->nchanges, 0);
  ASSERT_EQ(bh_canary_report_status(r), 0);
  char *text = report_text(r, 0);
  ASSERT_STR_CONTAINS(text, "OK: the StandIn answers every member");
  ASSERT_STR_CONTAINS(text, "mm.py:98");
  free(text);
  bh_canary_report_free(r);
  return 0;
}

/* Reads reached only when is_dynamic() is True are gated; every other
 * shape of condition is not. */
TEST_IMPL(canary_is_dynamic_gating) {
  const char *src =
      "def f(device, for_dynamic):\n"
      "    for entry in current_loaded_models:\n"
      "        patcher = entry.model\n"
      "        if patcher is None or not patcher.is_dynamic():\n"    /* 4 */
      "            continue\n"
      "        patcher.after_early_exit()\n"                         /* 6 */
      "    for i in range(len(current_loaded_models)):\n"
      "        if current_loaded_models[i].model.is_dynamic() and for_dynamic:\n"
      "            current_loaded_models[i].model.in_if_block()\n"   /* 9 */
      "        else:\n"
      "            current_loaded_models[i].model.in_else()\n"       /* 11 */
      "        if not current_loaded_models[i].model.is_dynamic():\n"
      "            current_loaded_models[i].model.in_not_block()\n"  /* 13 */
      "        else:\n"
      "            current_loaded_models[i].model.in_else_of_not()\n" /* 15 */
      "        p = current_loaded_models[i].model\n"
      "        x = p.in_ternary() if p.is_dynamic() else p.ternary_else()\n" /* 17 */
      "        y = p.is_dynamic() and p.after_and()\n"               /* 18 */
      "        z = [e.model.filtered() for e in current_loaded_models if e.model.is_dynamic()]\n" /* 19 */
      "        if p.is_dynamic(): p.inline_body()\n"                 /* 20 */
      "        if p.is_dynamic() or for_dynamic:\n"
      "            p.in_or_block()\n"                                /* 22 */
      "        if for_dynamic:\n"
      "            pass\n"
      "        elif not p.is_dynamic():\n"
      "            return\n"
      "        p.after_elif_exit()\n"                                /* 27 */
      "        if for_dynamic:\n"
      "            pass\n"
      "        elif p.is_dynamic():\n"
      "            p.in_elif()\n"                                    /* 31 */
      "        while (p.is_dynamic()):\n"
      "            p.in_while()\n"                                   /* 33 */
      "        z = p.is_dynamic() or p.after_or()\n"                 /* 34 */
      "        if not p.is_dynamic():\n"
      "            return\n"
      "        p.after_return()\n";                                  /* 37 */
  bh_canary_report *r = analyze(src);
  ASSERT_NAME(r, "is_dynamic", BH_CANARY_ANSWERED, 4);
  ASSERT_NAME(r, "after_early_exit", BH_CANARY_GATED, 6);
  ASSERT_NAME(r, "in_if_block", BH_CANARY_GATED, 9);
  ASSERT_NAME(r, "in_else", BH_CANARY_LACKING, 11);
  ASSERT_NAME(r, "in_not_block", BH_CANARY_LACKING, 13);
  ASSERT_NAME(r, "in_else_of_not", BH_CANARY_GATED, 15);
  ASSERT_NAME(r, "in_ternary", BH_CANARY_GATED, 17);
  ASSERT_NAME(r, "ternary_else", BH_CANARY_LACKING, 17);
  ASSERT_NAME(r, "after_and", BH_CANARY_GATED, 18);
  ASSERT_NAME(r, "filtered", BH_CANARY_GATED, 19);
  ASSERT_NAME(r, "inline_body", BH_CANARY_GATED, 20);
  ASSERT_NAME(r, "in_or_block", BH_CANARY_LACKING, 22);
  ASSERT_NAME(r, "after_elif_exit", BH_CANARY_LACKING, 27);
  ASSERT_NAME(r, "in_elif", BH_CANARY_GATED, 31);
  ASSERT_NAME(r, "in_while", BH_CANARY_GATED, 33);
  ASSERT_NAME(r, "after_or", BH_CANARY_LACKING, 34);
  ASSERT_NAME(r, "after_return", BH_CANARY_GATED, 37);
  ASSERT_EQ(r->ngated, 10);
  ASSERT_EQ(r->nlacking, 6);
  bh_canary_report_free(r);

  /* A gated read of a member the StandIn has is listed but changes
   * nothing; one it lacks does not fail the check. */
  r = analyze("def f():\n"
              "    for e in current_loaded_models:\n"
              "        if e.model.is_dynamic():\n"
              "            e.model.partially_unload_ram(5, subsets=1)\n"
              "            e.model.detach(unpatch_all=False, hypothetical=True)\n");
  ASSERT_NAME(r, "partially_unload_ram", BH_CANARY_GATED, 4);
  ASSERT_NAME(r, "detach", BH_CANARY_GATED, 5);
  ASSERT_EQ(r->nchanges, 0);
  ASSERT_EQ(bh_canary_report_status(r), 0);
  ASSERT(unread(r, "detach"));
  bh_canary_report_free(r);
  return 0;
}

/* Calls against the baseline: what the StandIn accepts, and every way a
 * shape can change. */
TEST_IMPL(canary_keyword_call_shapes) {
  const char *src =
      "def f(device):\n"
      "    for e in current_loaded_models:\n"
      "        p = e.model\n"
      "        p.detach()\n"                                          /* 4: ok */
      "        p.detach(False)\n"                                     /* 5: ok */
      "        p.detach(unpatch_all=False)\n"                         /* 6: ok */
      "        p.partially_load(device, 1e32, force_patch_weights=True)\n" /* 7: ok */
      "        p.partially_load(device_to=device, extra_memory=0.1)\n" /* 8: ok */
      "        p.partially_unload(device, memory_to_free=5, force_patch_weights=False)\n" /* 9 */
      "        p.is_clone(e.model)\n"                                 /* 10: ok */
      "        p.model_patches_to(device)\n"                          /* 11: ok */
      "        p.detach(unpatch_all=False, unpatch_weights=True)\n"   /* 12: new keyword */
      "        p.partially_load(device, 1, False, 7)\n"               /* 13: extra positional */
      "        p.is_clone(other=e.model)\n"                           /* 14: positional-only */
      "        p.partially_unload(memory_to_free=5)\n"                /* 15: missing device_to */
      "        p.detach(True, unpatch_all=True)\n"                    /* 16: given twice */
      "        p.model_size(**kw)\n"                                  /* 17: uncheckable */
      "        p.load_device(0)\n"                                    /* 18: attribute called */
      "        p.loaded_size\n"                                       /* 19: method not called */
      "        p.offload_device = device\n";                          /* 20: write */
  bh_canary_report *r = analyze(src);
  ASSERT_NOT_NULL(change_for(r, "detach", "keyword unpatch_weights= is not accepted"));
  ASSERT_EQ(change_for(r, "detach", "keyword unpatch_weights=")->line, 12);
  ASSERT_STR_EQ(change_for(r, "detach", "keyword")->shape, "detach(unpatch_all=..., unpatch_weights=...)");
  ASSERT_STR_CONTAINS(change_for(r, "detach", "keyword")->reason, "detach(unpatch_all=True)");
  ASSERT_EQ(change_for(r, "partially_load", "4 positional arguments")->line, 13);
  ASSERT_EQ(change_for(r, "is_clone", "keyword other= is not accepted")->line, 14);
  ASSERT_EQ(change_for(r, "partially_unload", "argument device_to is missing")->line, 15);
  ASSERT_EQ(change_for(r, "detach", "given twice")->line, 16);
  ASSERT_EQ(change_for(r, "model_size", "cannot check")->line, 17);
  ASSERT_EQ(change_for(r, "load_device", "called, but")->line, 18);
  ASSERT_EQ(change_for(r, "loaded_size", "read without a call")->line, 19);
  ASSERT_EQ(change_for(r, "offload_device", "read-only")->line, 20);
  ASSERT_EQ(r->nchanges, 9);
  for (size_t i = 1; i < r->nchanges; i++) ASSERT_LE(r->changes[i - 1].line, r->changes[i].line);
  ASSERT_EQ(r->nlacking, 0);
  ASSERT_EQ(bh_canary_report_status(r), 1);
  char *text = report_text(r, 0);
  ASSERT_STR_CONTAINS(text, "changed call shapes (9):");
  ASSERT_STR_CONTAINS(text, "mm.py:12");
  ASSERT_STR_CONTAINS(text, "FAIL:");
  free(text);
  bh_canary_report_free(r);
  return 0;
}

/* Issue 6: on a fixture with a removed member the canary fails naming
 * it.  Removed from the StandIn (--without), or a member upstream now
 * reads that the StandIn never had. */
TEST_IMPL(canary_removed_member) {
  const char *const without[] = {"detach", "is_clone", NULL};
  bh_canary_report *r = analyze_without(FULL, without);
  ASSERT_NAME(r, "detach", BH_CANARY_LACKING, 47);
  ASSERT_NAME(r, "is_clone", BH_CANARY_LACKING, 86);
  ASSERT_EQ(r->nlacking, 2);
  ASSERT_EQ(r->nchanges, 0); /* shapes are checked only for what it answers */
  ASSERT_EQ(r->nwithout, 2);
  ASSERT_EQ(bh_canary_report_status(r), 1);
  char *text = report_text(r, 0);
  ASSERT_STR_CONTAINS(text, "FAIL: the StandIn lacks detach is_clone");
  ASSERT_STR_CONTAINS(text, "left out with --without: detach is_clone");
  free(text);
  text = report_text(r, 1);
  ASSERT_STR_CONTAINS(text, "\"ok\": false");
  ASSERT_STR_CONTAINS(text, "\"without\": [\"detach\", \"is_clone\"]");
  ASSERT_STR_CONTAINS(text, "{\"name\": \"detach\", \"line\": 47");
  free(text);
  bh_canary_report_free(r);

  /* Without the inner module's member, `.model.model` is lacking too. */
  const char *const no_model[] = {"model", NULL};
  r = analyze_without(FULL, no_model);
  ASSERT_NAME(r, "model", BH_CANARY_LACKING, 34);
  bh_canary_report_free(r);

  const char *const bogus[] = {"no_such_member", NULL};
  bh_canary_report *none = NULL;
  ASSERT_RC(bh_canary_analyze("x", 1, bogus, &none), -EINVAL);
  ASSERT_NULL(none);
  return 0;
}

/* Issue 6: a renamed member fails naming the new name (and the old one
 * shows as no longer read). */
TEST_IMPL(canary_renamed_member) {
  char *src = strdup(FULL);
  ASSERT_NOT_NULL(src);
  for (char *p = src; (p = strstr(p, "loaded_size(")) != NULL; p++) memcpy(p, "resident_sz(", 12);
  bh_canary_report *r = analyze(src);
  ASSERT_NAME(r, "resident_sz", BH_CANARY_LACKING, 23);
  ASSERT_ABSENT(r, "loaded_size");
  ASSERT(unread(r, "loaded_size"));
  ASSERT_EQ(r->nlacking, 1);
  ASSERT_EQ(bh_canary_report_status(r), 1);
  char *text = report_text(r, 0);
  ASSERT_STR_CONTAINS(text, "FAIL: the StandIn lacks resident_sz");
  free(text);
  bh_canary_report_free(r);
  free(src);
  return 0;
}

/* Issue 6: a new keyword is a changed call shape. */
TEST_IMPL(canary_new_keyword) {
  const char *src = LOADED_MODEL
      "def unload(e):\n"
      "    e.model.partially_unload(e.model.offload_device, 5, force_patch_weights=True, ram_only=True)\n";
  bh_canary_report *r = analyze(src);
  const bh_canary_change *c = change_for(r, "partially_unload", "keyword ram_only= is not accepted");
  ASSERT_NOT_NULL(c);
  ASSERT_EQ(c->line, 57);
  ASSERT_STR_EQ(c->shape, "partially_unload(_, _, force_patch_weights=..., ram_only=...)");
  ASSERT_EQ(r->nchanges, 1);
  ASSERT_EQ(r->nlacking, 0);
  ASSERT_EQ(bh_canary_report_status(r), 1);
  char *json = report_text(r, 1);
  ASSERT_STR_CONTAINS(json, "\"changed\": [\n    {\"name\": \"partially_unload\", \"line\": 57");
  free(json);
  bh_canary_report_free(r);
  return 0;
}

/* Comments, strings and docstrings are not code; f-string fields are. */
TEST_IMPL(canary_strings_and_comments) {
  const char *src =
      "\"\"\"current_loaded_models[0].model.in_docstring()\"\"\"\n"
      "def f():\n"
      "    # current_loaded_models[0].model.in_comment()\n"
      "    s = 'current_loaded_models[0].model.in_string()'\n"
      "    t = '''\n"
      "current_loaded_models[0].model.in_triple()'''\n"
      "    u = \"{current_loaded_models[0].model.not_an_fstring}\"\n"
      "    v = f\"{{current_loaded_models[0].model.doubled_braces}}\"\n"
      "    w = f\"{current_loaded_models[0].model.in_field!r:>{current_loaded_models[0].model.in_spec}}\"\n" /* 9 */
      "    x = f'''\n"
      "{current_loaded_models[0].model.in_triple_field(\n"                      /* 11 */
      "    1)}'''\n"
      "    y = 1 + \\\n"
      "        current_loaded_models[0].model.after_continuation\n"            /* 14 */
      "    z = (current_loaded_models[0]\n"
      "         .model\n"
      "         .across_lines)\n";                                              /* 17 */
  bh_canary_report *r = analyze(src);
  ASSERT_NAME(r, "in_field", BH_CANARY_LACKING, 9);
  ASSERT_NAME(r, "in_spec", BH_CANARY_LACKING, 9);
  ASSERT_NAME(r, "in_triple_field", BH_CANARY_LACKING, 11);
  ASSERT_NAME(r, "after_continuation", BH_CANARY_LACKING, 14);
  ASSERT_NAME(r, "across_lines", BH_CANARY_LACKING, 17);
  ASSERT_EQ(r->nnames, 5);
  bh_canary_report_free(r);
  return 0;
}

/* hasattr / getattr with a default are probes; getattr without one is a
 * read. */
TEST_IMPL(canary_probes) {
  const char *src =
      "def f():\n"
      "    for e in current_loaded_models:\n"
      "        if hasattr(e.model, 'pin_state'):\n"
      "            pass\n"
      "        g = getattr(e.model, \"maybe\", None)\n"
      "        h = getattr(e.model, 'needed')\n"                     /* 6 */
      "        getattr(e.model, 'detach')(unpatch_all=False)\n"     /* 7 */
      "        hasattr(e.model, 'load_device')\n"
      "        e.model.load_device\n";
  bh_canary_report *r = analyze(src);
  ASSERT_NAME(r, "pin_state", BH_CANARY_PROBED, 0);
  ASSERT_NAME(r, "maybe", BH_CANARY_PROBED, 0);
  ASSERT_NAME(r, "needed", BH_CANARY_LACKING, 6);
  ASSERT_NAME(r, "detach", BH_CANARY_ANSWERED, 7);
  ASSERT_NAME(r, "load_device", BH_CANARY_ANSWERED, 9);
  ASSERT_EQ(bh_canary_report_find(r, "load_device")->uses, BH_CANARY_READ | BH_CANARY_PROBE);
  ASSERT_EQ(r->nprobed, 2);
  ASSERT_EQ(r->nchanges, 0);
  char *text = report_text(r, 0);
  ASSERT_STR_CONTAINS(text, "probed only");
  free(text);
  bh_canary_report_free(r);
  return 0;
}

/* -------------------------------------------------------- the command */

static char dir_template[] = "/tmp/bh-canary-XXXXXX";

static void write_file(const char *path, const char *text) {
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  ASSERT_SYS(fd);
  size_t n = strlen(text);
  ASSERT_EQ(write(fd, text, n), (ssize_t)n);
  ASSERT_SYS(close(fd));
}

/* Runs bh_canary_main in a child with stdout and stderr into files;
 * returns its exit status and the outputs (malloc'ed). */
static int run_main(const char *dir, char **out, char **err, const char *a1, const char *a2,
                    const char *a3, const char *a4) {
  char outp[256], errp[256];
  snprintf(outp, sizeof outp, "%s/stdout", dir);
  snprintf(errp, sizeof errp, "%s/stderr", dir);
  fflush(stdout);
  fflush(stderr);
  pid_t pid = fork();
  ASSERT_SYS(pid);
  if (pid == 0) {
    int o = open(outp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    int e = open(errp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (o < 0 || e < 0 || dup2(o, 1) < 0 || dup2(e, 2) < 0) _exit(99);
    char *argv[6] = {"canary", (char *)a1, (char *)a2, (char *)a3, (char *)a4, NULL};
    int argc = 1;
    while (argc < 5 && argv[argc]) argc++;
    int status = bh_canary_main(argc, argv);
    fflush(stdout);
    fflush(stderr);
    _exit(status);
  }
  int st;
  ASSERT_EQ(waitpid(pid, &st, 0), pid);
  ASSERT(WIFEXITED(st));
  char *bufs[2] = {NULL, NULL};
  const char *paths[2] = {outp, errp};
  for (int i = 0; i < 2; i++) {
    FILE *f = fopen(paths[i], "re");
    ASSERT_NOT_NULL(f);
    bufs[i] = calloc(1, 1 << 20);
    ASSERT_NOT_NULL(bufs[i]);
    size_t got = fread(bufs[i], 1, (1 << 20) - 1, f);
    bufs[i][got] = '\0';
    fclose(f);
    unlink(paths[i]);
  }
  *out = bufs[0], *err = bufs[1];
  return WEXITSTATUS(st);
}

TEST_IMPL(canary_main_exit_status) {
  char *dir = mkdtemp(dir_template);
  ASSERT_NOT_NULL(dir);
  char comfy[256], mm[256], plain[256], sub[256];
  snprintf(comfy, sizeof comfy, "%s/comfy", dir);
  snprintf(mm, sizeof mm, "%s/comfy/model_management.py", dir);
  snprintf(plain, sizeof plain, "%s/renamed.py", dir);
  snprintf(sub, sizeof sub, "%s/missing", dir);
  ASSERT_SYS(mkdir(comfy, 0755));
  write_file(mm, FULL);
  char *out, *err;

  /* Covers everything: 0, the report names the file and lines. */
  ASSERT_EQ(run_main(dir, &out, &err, dir, NULL, NULL, NULL), 0);
  ASSERT_STR_CONTAINS(out, "answered by the StandIn (17):");
  ASSERT_STR_CONTAINS(out, "/comfy/model_management.py:47");
  ASSERT_STR_CONTAINS(out, "OK:");
  free(out), free(err);

  /* JSON, the file named directly. */
  ASSERT_EQ(run_main(dir, &out, &err, "--json", mm, NULL, NULL), 0);
  ASSERT_STR_CONTAINS(out, "\"ok\": true");
  ASSERT_STR_CONTAINS(out, "\"lacking\": []");
  free(out), free(err);

  /* A member left out: 1 with the list. */
  ASSERT_EQ(run_main(dir, &out, &err, "--without", "detach", dir, NULL), 1);
  ASSERT_STR_CONTAINS(out, "FAIL: the StandIn lacks detach");
  free(out), free(err);
  ASSERT_EQ(run_main(dir, &out, &err, "--without=is_clone", "--json", dir, NULL), 1);
  ASSERT_STR_CONTAINS(out, "\"lacking\": [\n    {\"name\": \"is_clone\"");
  free(out), free(err);

  /* A renamed member in a file of another name: 1, naming it. */
  write_file(plain, "def f():\n    current_loaded_models[0].model.renamed_size()\n");
  ASSERT_EQ(run_main(dir, &out, &err, plain, NULL, NULL, NULL), 1);
  ASSERT_STR_CONTAINS(out, "renamed_size");
  ASSERT_STR_CONTAINS(out, "renamed.py:2");
  free(out), free(err);

  /* Unreadable: 2, naming the path and errno. */
  ASSERT_EQ(run_main(dir, &out, &err, sub, NULL, NULL, NULL), 2);
  ASSERT_STR_CONTAINS(err, "cannot read");
  ASSERT_STR_CONTAINS(err, "/missing/comfy/model_management.py");
  ASSERT_STR_CONTAINS(err, "(errno 2)");
  free(out), free(err);
  ASSERT_EQ(run_main(dir, &out, &err, "--json", sub, NULL, NULL), 2);
  ASSERT_STR_CONTAINS(out, "\"errno\": 2");
  free(out), free(err);
  /* A directory where the file should be: EISDIR. */
  char odd[256], oddmm[256];
  snprintf(odd, sizeof odd, "%s/odd", dir);
  snprintf(oddmm, sizeof oddmm, "%s/odd/comfy", dir);
  ASSERT_SYS(mkdir(odd, 0755));
  ASSERT_SYS(mkdir(oddmm, 0755));
  snprintf(oddmm, sizeof oddmm, "%s/odd/comfy/model_management.py", dir);
  ASSERT_SYS(mkdir(oddmm, 0755));
  ASSERT_EQ(run_main(dir, &out, &err, odd, NULL, NULL, NULL), 2);
  ASSERT_STR_CONTAINS(err, "(errno 21)");
  free(out), free(err);

  /* Usage errors: 2; --help: 0. */
  ASSERT_EQ(run_main(dir, &out, &err, NULL, NULL, NULL, NULL), 2);
  ASSERT_STR_CONTAINS(err, "usage:");
  free(out), free(err);
  ASSERT_EQ(run_main(dir, &out, &err, "--bogus", dir, NULL, NULL), 2);
  ASSERT_STR_CONTAINS(err, "unknown option --bogus");
  free(out), free(err);
  ASSERT_EQ(run_main(dir, &out, &err, dir, dir, NULL, NULL), 2);
  free(out), free(err);
  ASSERT_EQ(run_main(dir, &out, &err, "--without", "nonsense", dir, NULL), 2);
  ASSERT_STR_CONTAINS(err, "no member of that name");
  free(out), free(err);
  ASSERT_EQ(run_main(dir, &out, &err, dir, "--without", NULL, NULL), 2);
  free(out), free(err);
  ASSERT_EQ(run_main(dir, &out, &err, "--help", NULL, NULL, NULL), 0);
  ASSERT_STR_CONTAINS(out, "usage: bulkhead canary");
  free(out), free(err);

  ASSERT_SYS(rmdir(oddmm));
  snprintf(oddmm, sizeof oddmm, "%s/odd/comfy", dir);
  ASSERT_SYS(rmdir(oddmm));
  ASSERT_SYS(rmdir(odd));
  ASSERT_SYS(unlink(plain));
  ASSERT_SYS(unlink(mm));
  ASSERT_SYS(rmdir(comfy));
  ASSERT_SYS(rmdir(dir));
  return 0;
}

/* --------------------------------------------------------------- fuzz */

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint64_t rnd(void) {
  rng_state ^= rng_state << 13;
  rng_state ^= rng_state >> 7;
  rng_state ^= rng_state << 17;
  return rng_state;
}

/* Tokenizes and analyzes buf[0, len) (a buffer of exactly len bytes),
 * checks the token invariants and renders both reports. */
static void check_input(const char *buf, size_t len, FILE *sink) {
  bh_canary_token *t = NULL;
  size_t n = 0;
  ASSERT_OK(bh_canary_tokenize(buf, len, &t, &n));
  ASSERT_GE(n, 1);
  ASSERT_EQ(t[n - 1].kind, BH_TOK_END);
  for (size_t i = 0; i < n; i++) {
    ASSERT_LE((uint64_t)t[i].off + t[i].len, len);
    ASSERT_GE(t[i].line, 1);
    if (i) {
      ASSERT_GE(t[i].line, t[i - 1].line);
      ASSERT_GE(t[i].off, t[i - 1].off);
    }
  }
  free(t);
  bh_canary_report *r = NULL;
  ASSERT_OK(bh_canary_analyze(buf, len, NULL, &r));
  int st = bh_canary_report_status(r);
  ASSERT(st == 0 || st == 1);
  ASSERT_OK(bh_canary_report_write(r, "fuzz.py", 0, sink));
  ASSERT_OK(bh_canary_report_write(r, "fuzz.py", 1, sink));
  bh_canary_report_free(r);
}

static FILE *null_sink(void) {
  FILE *f = fopen("/dev/null", "we");
  ASSERT_NOT_NULL(f);
  return f;
}

TEST_IMPL(canary_fuzz_random) {
  static const char alphabet[] = "\"'{}()[]\\\n\n\n\r\t #:.,=fFrRbB_xm0 1e+-*!<>;";
  enum { N = 6000, MAXLEN = 200 };
  FILE *sink = null_sink();
  for (int iter = 0; iter < N; iter++) {
    size_t len = (size_t)(rnd() % MAXLEN);
    char *buf = malloc(len ? len : 1);
    ASSERT_NOT_NULL(buf);
    int raw = iter % 3 == 0;
    for (size_t i = 0; i < len; i++)
      buf[i] = raw ? (char)(rnd() & 0xff) : alphabet[rnd() % (sizeof alphabet - 1)];
    check_input(buf, len, sink);
    free(buf);
  }
  fclose(sink);
  return 0;
}

/* Python-shaped token soup: reaches the statement walker, the gating and
 * the chains far more often than random bytes do. */
TEST_IMPL(canary_fuzz_token_soup) {
  static const char *const vocab[] = {
      "current_loaded_models", ".", "model", "is_dynamic", "(", ")", "[", "]", "{", "}",
      "if ", "not ", " and ", " or ", "else", "elif ", "for ", " in ", ":", "\n", "    ",
      "        ", "return", "continue", "f\"{", "}\"", "f'{", "'", "\"", "'''", " = ", ",",
      "x", "e", "p", "def ", "current_loaded_models[0].model", "e.model", ".model.", "p = e.model\n",
      "for e in current_loaded_models:\n", ".detach(", ".loaded_size()", "x.model.is_dynamic()",
      "p.", "e.model.partially_load(", "extra_memory=", "def load_models_gpu(models):\n",
      "for m in models:\n", "m.", "load_models_gpu", "unload_model_and_clones", "class LoadedModel",
      "self", "lambda ", "\\\n", "#", "detach", "unpatch_all=", "*", "**", "LoadedModel(",
      "enumerate(", "sorted(", ".append(", ".pop(", "getattr(", "hasattr(", "!r", "while ",
      ";", " as ", "0", "1e32", "yield ", "\t", "\r\n", "@", "async ", " if ", " else "};
  enum { N = 5000, MAXTOK = 120 };
  FILE *sink = null_sink();
  char *tmp = malloc(MAXTOK * 32);
  ASSERT_NOT_NULL(tmp);
  size_t nonempty = 0;
  for (int iter = 0; iter < N; iter++) {
    size_t len = 0, ntok = (size_t)(rnd() % MAXTOK);
    for (size_t k = 0; k < ntok; k++) {
      const char *v = vocab[rnd() % (sizeof vocab / sizeof vocab[0])];
      size_t vl = strlen(v);
      memcpy(tmp + len, v, vl);
      len += vl;
    }
    char *buf = malloc(len ? len : 1);
    ASSERT_NOT_NULL(buf);
    memcpy(buf, tmp, len);
    check_input(buf, len, sink);
    bh_canary_report *r = NULL;
    ASSERT_OK(bh_canary_analyze(buf, len, NULL, &r));
    nonempty += r->nnames > 0;
    bh_canary_report_free(r);
    free(buf);
  }
  free(tmp);
  fclose(sink);
  printf("token soup: %zu of %d inputs derived something\n", nonempty, N);
  ASSERT_GT(nonempty, N / 20);
  return 0;
}

/* The fixture sources with 1-8 random edits each. */
TEST_IMPL(canary_fuzz_mutations) {
  static const char *const seeds[] = {FULL, LOADED_MODEL, UNLOAD_CLONES};
  static const char specials[] = "\"'{}()[]\\\n:#f. ";
  enum { PER = 700 };
  FILE *sink = null_sink();
  for (size_t s = 0; s < sizeof seeds / sizeof seeds[0]; s++) {
    size_t slen = strlen(seeds[s]);
    for (int iter = 0; iter < PER; iter++) {
      size_t cap = slen * 2 + 64, len = slen;
      char *work = malloc(cap);
      ASSERT_NOT_NULL(work);
      memcpy(work, seeds[s], slen);
      int edits = 1 + (int)(rnd() % 8);
      for (int e = 0; e < edits; e++) {
        size_t at = len ? (size_t)(rnd() % len) : 0;
        switch (rnd() % 5) {
        case 0: /* flip a byte */
          if (len) work[at] = (char)(rnd() & 0xff);
          break;
        case 1: /* insert a significant character */
          if (len + 1 < cap) {
            memmove(work + at + 1, work + at, len - at);
            work[at] = specials[rnd() % (sizeof specials - 1)];
            len++;
          }
          break;
        case 2: { /* delete a range */
          size_t n = (size_t)(rnd() % 40);
          if (at + n > len) n = len - at;
          memmove(work + at, work + at + n, len - at - n);
          len -= n;
          break;
        }
        case 3: { /* duplicate a range */
          size_t n = (size_t)(rnd() % 60);
          if (at + n > len) n = len - at;
          if (len + n <= cap) {
            memmove(work + at + n, work + at, len - at);
            len += n;
          }
          break;
        }
        default: /* truncate */
          len = at;
          break;
        }
      }
      char *buf = malloc(len ? len : 1);
      ASSERT_NOT_NULL(buf);
      memcpy(buf, work, len);
      check_input(buf, len, sink);
      free(buf);
      free(work);
    }
  }
  fclose(sink);
  return 0;
}

/* Deep nesting of every kind: no recursion follows it unbounded. */
TEST_IMPL(canary_deep_nesting) {
  static const char *const units[][3] = {
      /* prefix repeated, middle once, suffix repeated */
      {"(", "current_loaded_models[0].model.deep()", ")"},
      {"(", "", ""},
      {"f\"{", "x", "}\""},
      {"f'{x:{", "y", "}}'"},
      {"not ", "current_loaded_models[0].model.is_dynamic()", ""},
      {"a if current_loaded_models[0].model.is_dynamic() else ", "b", ""},
      {"if x: ", "current_loaded_models[0].model.inline()", ""},
      {"sorted(", "current_loaded_models", ")"},
      {"[y for y in ", "current_loaded_models", "]"},
      {"current_loaded_models[0].model.is_dynamic() and ", "x", ""},
      {"x", ".model", ""},
      {"lambda: ", "x", ""},
      {"\\\n", "x", ""},
  };
  enum { REPS = 20000 };
  FILE *sink = null_sink();
  for (size_t u = 0; u < sizeof units / sizeof units[0]; u++) {
    size_t pl = strlen(units[u][0]), ml = strlen(units[u][1]), sl = strlen(units[u][2]);
    size_t len = REPS * (pl + sl) + ml + 1;
    char *buf = malloc(len);
    ASSERT_NOT_NULL(buf);
    size_t at = 0;
    for (int i = 0; i < REPS; i++, at += pl) memcpy(buf + at, units[u][0], pl);
    memcpy(buf + at, units[u][1], ml);
    at += ml;
    for (int i = 0; i < REPS; i++, at += sl) memcpy(buf + at, units[u][2], sl);
    buf[at++] = '\n';
    ASSERT_EQ(at, len);
    int64_t t0 = bh_test_now_ms();
    check_input(buf, len, sink);
    int64_t ms = bh_test_now_ms() - t0;
    if (ms > 2000) printf("unit %zu (%s): %lld ms\n", u, units[u][0], (long long)ms);
    free(buf);
  }
  fclose(sink);
  return 0;
}
