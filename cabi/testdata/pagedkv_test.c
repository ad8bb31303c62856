// pagedkv_test.c - the C ABI test: the Go Example's scenario through
// pagedkv.h, then a bad-input sweep in which every failed call must return
// the expected code, name the bad value in pagedkv_last_error(), and
// change nothing (stats, every request's state, tokens and pages, the
// pending flag, and the last plan's arrays are compared before and after).
//
// padded() runs 10^4 randomized steps and checks every plan's padded
// block_tables against its CSR arrays.
//
// Built and run by scripts/cabi.sh (and by the Go test in cabi/), once
// against libpagedkv.so and once against libpagedkv.a:
//   gcc -std=c11 -Wall -Werror -I cabi cabi/testdata/pagedkv_test.c -L DIR -lpagedkv

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pagedkv.h"

// Not in pagedkv.h: a test hook that panics inside Go.
int32_t pagedkv_debug_panic(pagedkv_manager m);

static int failures;

#define CHECK(cond, ...)                                              \
	do {                                                          \
		if (!(cond)) {                                        \
			fprintf(stderr, "%s:%d: FAIL: ", __FILE__, __LINE__); \
			fprintf(stderr, __VA_ARGS__);                 \
			fprintf(stderr, "\n");                        \
			failures++;                                   \
		}                                                     \
	} while (0)

#define OK(call)                                                                          \
	do {                                                                              \
		int32_t rc_ = (call);                                                     \
		if (rc_ != PAGEDKV_OK) {                                                  \
			fprintf(stderr, "%s:%d: %s = %d: %s\n", __FILE__, __LINE__, #call, rc_, \
			        pagedkv_last_error());                                    \
			exit(1);                                                          \
		}                                                                         \
	} while (0)

static void print_array(char *buf, size_t n, const char *name, pagedkv_array a) {
	size_t len = strlen(buf);
	len += snprintf(buf + len, n - len, "%s [", name);
	for (int64_t i = 0; i < a.len; i++) {
		len += snprintf(buf + len, n - len, i ? " %d" : "%d", a.data[i]);
	}
	snprintf(buf + len, n - len, "]");
}

// ---- State snapshots ----

enum { MAX_IDS = 8, MAX_VALS = 256 };
static const uint64_t known_ids[MAX_IDS] = {1, 2, 3, 4, 5, 6, 7, 8};

typedef struct {
	pagedkv_stats stats;
	int32_t pending;
	int32_t exists[MAX_IDS];
	pagedkv_request_state state[MAX_IDS];
	int64_t ntok[MAX_IDS], npages[MAX_IDS];
	int32_t tokens[MAX_IDS][MAX_VALS], pages[MAX_IDS][MAX_VALS];
	int64_t plan_len;
	int32_t plan_values[4 * MAX_VALS];
} snapshot;

static pagedkv_plan last_plan;
static int have_plan;

static int64_t flatten_plan(int32_t *dst) {
	if (!have_plan) {
		return 0;
	}
	const pagedkv_array *arrays[] = {&last_plan.copies, &last_plan.qo_indptr, &last_plan.batch_indices,
	                                 &last_plan.positions, &last_plan.token_ids, &last_plan.token_positions,
	                                 &last_plan.kv_indptr, &last_plan.kv_page_indices,
	                                 &last_plan.kv_last_page_len, &last_plan.seq_lens};
	int64_t n = 0;
	for (size_t i = 0; i < sizeof arrays / sizeof arrays[0]; i++) {
		for (int64_t j = 0; j < arrays[i]->len && n < 4 * MAX_VALS; j++) {
			dst[n++] = arrays[i]->data[j];
		}
	}
	return n;
}

static void take(pagedkv_manager m, snapshot *s) {
	memset(s, 0, sizeof *s);
	OK(pagedkv_get_stats(m, &s->stats, sizeof s->stats));
	OK(pagedkv_pending(m, &s->pending));
	for (int i = 0; i < MAX_IDS; i++) {
		int32_t rc = pagedkv_get_request_state(m, known_ids[i], &s->state[i]);
		if (rc == PAGEDKV_ERR_UNKNOWN_REQUEST) {
			continue;
		}
		OK(rc);
		s->exists[i] = 1;
		OK(pagedkv_request_tokens(m, known_ids[i], s->tokens[i], MAX_VALS, &s->ntok[i]));
		OK(pagedkv_request_pages(m, known_ids[i], s->pages[i], MAX_VALS, &s->npages[i]));
	}
	s->plan_len = flatten_plan(s->plan_values);
}

// expect_fail runs a call that must fail with code want, with a message
// containing needle, and leave the manager as it was: snap_t snapshots
// taken by takefn before and after must be equal.
#define EXPECT_FAIL_WITH(snap_t, takefn, m, want, needle, call)                                      \
	do {                                                                                         \
		snap_t before_, after_;                                                              \
		takefn((m), &before_);                                                               \
		int32_t rc_ = (call);                                                                \
		const char *msg_ = pagedkv_last_error();                                             \
		CHECK(rc_ == (want), "%s = %d, want %d (%s)", #call, rc_, (want), msg_);            \
		CHECK(strstr(msg_, (needle)) != NULL, "%s: message %s does not name %s", #call, msg_, \
		      (needle));                                                                     \
		takefn((m), &after_);                                                                \
		CHECK(memcmp(&before_, &after_, sizeof before_) == 0, "%s changed the manager", #call); \
		checked++;                                                                           \
	} while (0)

#define EXPECT_FAIL(m, want, needle, call) EXPECT_FAIL_WITH(snapshot, take, m, want, needle, call)

static int checked;

static pagedkv_manager create(int64_t pages, int64_t page_size, int64_t max_pinned) {
	pagedkv_config cfg = {0};
	cfg.num_pages = pages;
	cfg.page_size = page_size;
	cfg.hash_seed = 1;
	cfg.max_pinned_pages = max_pinned;
	pagedkv_manager m = 0;
	OK(pagedkv_create(&cfg, sizeof cfg, &m));
	CHECK(m != 0, "create returned handle 0");
	return m;
}

// ---- The Go Example, through C ----

// prompt_request fills prompt [n] with tokens 100, 101, ... and returns a
// request for it.
static pagedkv_request prompt_request(int32_t *prompt, int n) {
	for (int i = 0; i < n; i++) {
		prompt[i] = 100 + i;
	}
	pagedkv_request req = {0};
	req.prompt = prompt;
	req.prompt_len = n;
	return req;
}

static void example(void) {
	char out[1024] = "";
	pagedkv_manager m = create(64, 16, 0);
	int32_t prompt[40];
	pagedkv_request req = prompt_request(prompt, 40);

	OK(pagedkv_add(m, 1, &req, NULL));
	uint64_t ids1[] = {1};
	int32_t nt1[] = {40};
	pagedkv_plan plan;
	OK(pagedkv_reserve(m, ids1, nt1, 1, &plan));
	CHECK(plan.attention_kind == PAGEDKV_ATTENTION_PREFILL, "a 40-row prompt: attention_kind %lld, want PREFILL",
	      (long long)plan.attention_kind);
	print_array(out, sizeof out, "kv_indptr", plan.kv_indptr);
	strcat(out, " ");
	print_array(out, sizeof out, "kv_last_page_len", plan.kv_last_page_len);
	strcat(out, "\n");
	int32_t s1[] = {7};
	OK(pagedkv_commit(m, s1, 1));

	int64_t matched = -1;
	OK(pagedkv_add(m, 2, &req, &matched));
	snprintf(out + strlen(out), sizeof out - strlen(out), "request 2 matched %lld tokens\n", (long long)matched);

	uint64_t ids2[] = {1, 2};
	int32_t nt2[] = {1, (int32_t)(40 - matched)};
	OK(pagedkv_reserve(m, ids2, nt2, 2, &plan));
	print_array(out, sizeof out, "qo_indptr", plan.qo_indptr);
	strcat(out, " ");
	print_array(out, sizeof out, "seq_lens", plan.seq_lens);
	strcat(out, "\n");
	int32_t s2[] = {8, 9};
	OK(pagedkv_commit(m, s2, 2));
	OK(pagedkv_audit(m));

	const char *want =
	    "kv_indptr [0 3] kv_last_page_len [8]\n"
	    "request 2 matched 32 tokens\n"
	    "qo_indptr [0 1 9] seq_lens [41 40]\n";
	CHECK(strcmp(out, want) == 0, "example printed\n%s\nwant\n%s", out, want);
	fputs(out, stdout);

	pagedkv_stats st;
	OK(pagedkv_get_stats(m, &st, sizeof st));
	CHECK(st.requests == 2 && st.steps == 2 && st.prompt_hit_tokens == 32,
	      "stats: requests %lld steps %lld hits %lld", (long long)st.requests, (long long)st.steps,
	      (long long)st.prompt_hit_tokens);
	CHECK(st.total_pages == st.free_pages + st.used_pages + st.evictable_pages + st.pinned_idle_pages,
	      "stats do not partition the pool");
	OK(pagedkv_destroy(m));
}

// ---- Bad input ----

static void bad_config(void) {
	struct {
		pagedkv_config cfg;
		const char *needle;
	} cases[] = {
	    {{.num_pages = 0, .page_size = 16}, "0"},
	    {{.num_pages = -5, .page_size = 16}, "-5"},
	    {{.num_pages = 64, .page_size = 0}, "0"},
	    {{.num_pages = 64, .page_size = -16}, "-16"},
	    {{.num_pages = 64, .page_size = 16, .window_tokens = -3}, "-3"},
	    {{.num_pages = 64, .page_size = 16, .priorities = 99}, "99"},
	    {{.num_pages = 64, .page_size = 16, .priorities = -1}, "-1"},
	};
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		pagedkv_manager m = 12345;
		int32_t rc = pagedkv_create(&cases[i].cfg, sizeof cases[i].cfg, &m);
		CHECK(rc == PAGEDKV_ERR_BAD_CONFIG, "config case %zu: rc %d (%s)", i, rc, pagedkv_last_error());
		CHECK(strstr(pagedkv_last_error(), cases[i].needle) != NULL, "config case %zu: %s does not name %s", i,
		      pagedkv_last_error(), cases[i].needle);
		CHECK(m == 12345, "a failed create wrote the handle");
		checked++;
	}
	pagedkv_config cfg = {.num_pages = 8, .page_size = 4};
	pagedkv_manager m = 0;
	CHECK(pagedkv_create(&cfg, sizeof cfg - 4, &m) == PAGEDKV_ERR_BAD_ARGUMENT && m == 0, "short cfg_size");
	CHECK(pagedkv_create(&cfg, offsetof(pagedkv_config, memory_limit) - 8, &m) == PAGEDKV_ERR_BAD_ARGUMENT && m == 0,
	      "cfg_size of no version");
	CHECK(pagedkv_create(NULL, sizeof cfg, &m) == PAGEDKV_ERR_BAD_ARGUMENT, "NULL cfg");
	CHECK(pagedkv_create(&cfg, sizeof cfg, NULL) == PAGEDKV_ERR_BAD_ARGUMENT, "NULL out");
	checked += 3;
}

static void sweep(void) {
	// A small pool: 8 pages of 4 tokens, at most 2 pinned.
	pagedkv_manager m = create(8, 4, 2);
	int32_t prompt[10] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
	pagedkv_request req = {0};
	req.prompt = prompt;
	req.prompt_len = 10;
	OK(pagedkv_add(m, 1, &req, NULL));
	uint64_t ids[] = {1};
	int32_t nt[] = {10};
	OK(pagedkv_reserve(m, ids, nt, 1, &last_plan));
	have_plan = 1;
	int32_t seven = 7;
	OK(pagedkv_commit(m, &seven, 1));
	OK(pagedkv_add(m, 2, &req, NULL));
	OK(pagedkv_fork(m, 1, 3));
	OK(pagedkv_add(m, 4, &req, NULL));
	OK(pagedkv_preempt(m, 4));

	int64_t matched = 0;
	int32_t neg[] = {5, -9};
	int32_t tok[] = {1, 2, 3};
	pagedkv_plan plan;

	// Handles.
	EXPECT_FAIL(m, PAGEDKV_ERR_BAD_HANDLE, "0", pagedkv_add(0, 9, &req, NULL));
	EXPECT_FAIL(m, PAGEDKV_ERR_BAD_HANDLE, "987654", pagedkv_audit(987654));
	EXPECT_FAIL(m, PAGEDKV_ERR_BAD_HANDLE, "987654", pagedkv_destroy(987654));
	pagedkv_stats st;
	EXPECT_FAIL(m, PAGEDKV_ERR_BAD_HANDLE, "987654", pagedkv_get_stats(987654, &st, sizeof st));

	// Per request.
	EXPECT_FAIL(m, PAGEDKV_ERR_REQUEST_EXISTS, "1", pagedkv_add(m, 1, &req, &matched));
	EXPECT_FAIL(m, PAGEDKV_ERR_BAD_ARGUMENT, "NULL", pagedkv_add(m, 9, NULL, &matched));
	pagedkv_request bad = req;
	bad.prompt = NULL;
	EXPECT_FAIL(m, PAGEDKV_ERR_BAD_ARGUMENT, "prompt is NULL with length 10", pagedkv_add(m, 9, &bad, &matched));
	bad = req;
	bad.prompt_len = -1;
	EXPECT_FAIL(m, PAGEDKV_ERR_BAD_ARGUMENT, "-1", pagedkv_add(m, 9, &bad, &matched));
	bad = req;
	bad.prompt = neg;
	bad.prompt_len = 2;
	EXPECT_FAIL(m, PAGEDKV_ERR_BAD_ARGUMENT, "prompt[1] = -9", pagedkv_add(m, 9, &bad, &matched));
	bad = req;
	bad.priority = 4;
	EXPECT_FAIL(m, PAGEDKV_ERR_BAD_ARGUMENT, "priority 4", pagedkv_add(m, 9, &bad, &matched));
	bad.priority = 256;
	EXPECT_FAIL(m, PAGEDKV_ERR_BAD_ARGUMENT, "256", pagedkv_add(m, 9, &bad, &matched));
	bad.priority = -1;
	EXPECT_FAIL(m, PAGEDKV_ERR_BAD_ARGUMENT, "-1", pagedkv_add(m, 9, &bad, &matched));
	bad = req;
	bad.capacity_tokens = -2;
	EXPECT_FAIL(m, PAGEDKV_ERR_BAD_ARGUMENT, "-2", pagedkv_add(m, 9, &bad, &matched));
	bad = req;
	bad.ns.tenant = NULL;
	bad.ns.tenant_len = 3;
	EXPECT_FAIL(m, PAGEDKV_ERR_BAD_ARGUMENT, "ns.tenant", pagedkv_add(m, 9, &bad, &matched));
	bad = req;
	bad.ns.salt = "x";
	bad.ns.salt_len = -1;
	EXPECT_FAIL(m, PAGEDKV_ERR_BAD_ARGUMENT, "ns.salt", pagedkv_add(m, 9, &bad, &matched));

	EXPECT_FAIL(m, PAGEDKV_ERR_UNKNOWN_REQUEST, "9", pagedkv_extend(m, 9, tok, 3));
	EXPECT_FAIL(m, PAGEDKV_ERR_BAD_ARGUMENT, "tokens[1] = -9", pagedkv_extend(m, 1, neg, 2));
	EXPECT_FAIL(m, PAGEDKV_ERR_BAD_ARGUMENT, "NULL", pagedkv_extend(m, 1, NULL, 2));
	EXPECT_FAIL(m, PAGEDKV_ERR_BAD_ARGUMENT, "-4", pagedkv_extend(m, 1, tok, -4));

	EXPECT_FAIL(m, PAGEDKV_ERR_UNKNOWN_REQUEST, "9", pagedkv_fork(m, 9, 10));
	EXPECT_FAIL(m, PAGEDKV_ERR_REQUEST_EXISTS, "2", pagedkv_fork(m, 1, 2));
	EXPECT_FAIL(m, PAGEDKV_ERR_PREEMPTED, "4", pagedkv_fork(m, 4, 10));

	EXPECT_FAIL(m, PAGEDKV_ERR_UNKNOWN_REQUEST, "9", pagedkv_preempt(m, 9));
	EXPECT_FAIL(m, PAGEDKV_ERR_PREEMPTED, "4", pagedkv_preempt(m, 4));
	EXPECT_FAIL(m, PAGEDKV_ERR_UNKNOWN_REQUEST, "9", pagedkv_resume(m, 9, &matched));
	EXPECT_FAIL(m, PAGEDKV_ERR_NOT_PREEMPTED, "1", pagedkv_resume(m, 1, &matched));
	EXPECT_FAIL(m, PAGEDKV_ERR_UNKNOWN_REQUEST, "9", pagedkv_release(m, 9));

	// Per step.
	EXPECT_FAIL(m, PAGEDKV_ERR_NO_STEP, "commit", pagedkv_commit(m, NULL, 0));
	EXPECT_FAIL(m, PAGEDKV_ERR_NO_STEP, "abort", pagedkv_abort(m));
	uint64_t two[] = {2, 2};
	int32_t ones[] = {1, 1};
	EXPECT_FAIL(m, PAGEDKV_ERR_BAD_ARGUMENT, "appears twice", pagedkv_reserve(m, two, ones, 2, &plan));
	uint64_t unknown[] = {2, 9};
	EXPECT_FAIL(m, PAGEDKV_ERR_UNKNOWN_REQUEST, "ids[1] = 9", pagedkv_reserve(m, unknown, ones, 2, &plan));
	uint64_t pre[] = {4};
	EXPECT_FAIL(m, PAGEDKV_ERR_PREEMPTED, "ids[0] = 4", pagedkv_reserve(m, pre, ones, 1, &plan));
	int32_t toomany[] = {11};
	uint64_t one1[] = {2};
	EXPECT_FAIL(m, PAGEDKV_ERR_BAD_ARGUMENT, "ntokens[0] = 11", pagedkv_reserve(m, one1, toomany, 1, &plan));
	int32_t negn[] = {-1};
	EXPECT_FAIL(m, PAGEDKV_ERR_BAD_ARGUMENT, "ntokens[0] = -1", pagedkv_reserve(m, one1, negn, 1, &plan));
	EXPECT_FAIL(m, PAGEDKV_ERR_BAD_ARGUMENT, "ids is NULL", pagedkv_reserve(m, NULL, ones, 1, &plan));
	EXPECT_FAIL(m, PAGEDKV_ERR_BAD_ARGUMENT, "ntokens is NULL", pagedkv_reserve(m, one1, NULL, 1, &plan));
	EXPECT_FAIL(m, PAGEDKV_ERR_BAD_ARGUMENT, "-1", pagedkv_reserve(m, one1, ones, -1, &plan));
	EXPECT_FAIL(m, PAGEDKV_ERR_BAD_ARGUMENT, "out is NULL", pagedkv_reserve(m, one1, ones, 1, NULL));
	// Request 2 needs 2 more pages (8 tokens after its 8 cached), request
	// 3 one copy-on-write page: more than the 8-page pool has left.
	OK(pagedkv_extend(m, 3, tok, 3));
	uint64_t big[] = {2, 3};
	int32_t bign[] = {2, 4};
	{
		int32_t fill[40];
		for (int i = 0; i < 40; i++) {
			fill[i] = 500 + i;
		}
		OK(pagedkv_extend(m, 2, fill, 40));
	}
	int32_t huge[] = {42, 4};
	EXPECT_FAIL(m, PAGEDKV_ERR_OUT_OF_PAGES, "needs", pagedkv_reserve(m, big, huge, 2, &plan));

	OK(pagedkv_reserve(m, big, bign, 2, &last_plan));
	EXPECT_FAIL(m, PAGEDKV_ERR_STEP_PENDING, "reserve", pagedkv_reserve(m, big, bign, 2, &plan));
	EXPECT_FAIL(m, PAGEDKV_ERR_STEP_PENDING, "add", pagedkv_add(m, 9, &req, &matched));
	EXPECT_FAIL(m, PAGEDKV_ERR_STEP_PENDING, "extend", pagedkv_extend(m, 1, tok, 1));
	EXPECT_FAIL(m, PAGEDKV_ERR_STEP_PENDING, "fork", pagedkv_fork(m, 1, 9));
	EXPECT_FAIL(m, PAGEDKV_ERR_STEP_PENDING, "preempt", pagedkv_preempt(m, 1));
	EXPECT_FAIL(m, PAGEDKV_ERR_STEP_PENDING, "resume", pagedkv_resume(m, 4, &matched));
	EXPECT_FAIL(m, PAGEDKV_ERR_STEP_PENDING, "release", pagedkv_release(m, 1));
	int32_t s3[] = {1, 2, 3};
	EXPECT_FAIL(m, PAGEDKV_ERR_BAD_ARGUMENT, "3 sampled tokens", pagedkv_commit(m, s3, 3));
	int32_t sneg[] = {-5, -1};
	EXPECT_FAIL(m, PAGEDKV_ERR_BAD_ARGUMENT, "sampled[0] = -5", pagedkv_commit(m, sneg, 2));
	int32_t searly[] = {77, -1};
	EXPECT_FAIL(m, PAGEDKV_ERR_BAD_ARGUMENT, "sampled[0] = 77", pagedkv_commit(m, searly, 2));
	EXPECT_FAIL(m, PAGEDKV_ERR_BAD_ARGUMENT, "NULL", pagedkv_commit(m, NULL, 2));
	OK(pagedkv_abort(m));
	OK(pagedkv_reserve(m, big, bign, 2, &last_plan));
	int32_t sok[] = {-1, 11};
	OK(pagedkv_commit(m, sok, 2));
	OK(pagedkv_audit(m));

	// Speculative decoding: request 1 decodes its last token and 3 drafts.
	uint64_t spec_ids[] = {1};
	int32_t spec_nt[] = {1};
	int32_t draft_indptr[] = {0, 3};
	int32_t drafts[] = {5, 6, 7};
	int32_t bad_indptr0[] = {1, 3};
	int32_t bad_indptr1[] = {0, -1};
	EXPECT_FAIL(m, PAGEDKV_ERR_BAD_ARGUMENT, "draft_indptr[0] = 1",
	            pagedkv_reserve_spec(m, spec_ids, spec_nt, 1, bad_indptr0, drafts, &plan));
	EXPECT_FAIL(m, PAGEDKV_ERR_BAD_ARGUMENT, "draft_indptr[1] = -1",
	            pagedkv_reserve_spec(m, spec_ids, spec_nt, 1, bad_indptr1, drafts, &plan));
	EXPECT_FAIL(m, PAGEDKV_ERR_BAD_ARGUMENT, "drafts is NULL with length 3",
	            pagedkv_reserve_spec(m, spec_ids, spec_nt, 1, draft_indptr, NULL, &plan));
	EXPECT_FAIL(m, PAGEDKV_ERR_BAD_ARGUMENT, "drafts without draft_indptr",
	            pagedkv_reserve_spec(m, spec_ids, spec_nt, 1, NULL, drafts, &plan));
	int32_t neg_draft[] = {5, -6, 7};
	EXPECT_FAIL(m, PAGEDKV_ERR_BAD_ARGUMENT, "drafts[0][1] = -6",
	            pagedkv_reserve_spec(m, spec_ids, spec_nt, 1, draft_indptr, neg_draft, &plan));
	EXPECT_FAIL(m, PAGEDKV_ERR_UNKNOWN_REQUEST, "truncate request 9", pagedkv_truncate(m, 9, 1));
	EXPECT_FAIL(m, PAGEDKV_ERR_BAD_ARGUMENT, "-1", pagedkv_truncate(m, 1, -1));
	EXPECT_FAIL(m, PAGEDKV_ERR_BAD_ARGUMENT, "to 99 tokens", pagedkv_truncate(m, 1, 99));
	OK(pagedkv_reserve_spec(m, spec_ids, spec_nt, 1, draft_indptr, drafts, &last_plan));
	CHECK(last_plan.nnz == 4 && last_plan.drafts.len == 1 && last_plan.drafts.data[0] == 3,
	      "spec plan: nnz %lld, drafts[0] %d", (long long)last_plan.nnz, last_plan.drafts.data[0]);
	CHECK(last_plan.token_ids.data[1] == 5 && last_plan.token_ids.data[3] == 7, "spec plan token_ids");
	int32_t one_sampled[] = {9};
	int32_t acc_bad[] = {4};
	int32_t acc_ok[] = {1};
	EXPECT_FAIL(m, PAGEDKV_ERR_BAD_ARGUMENT, "CommitSpec", pagedkv_commit(m, one_sampled, 1));
	EXPECT_FAIL(m, PAGEDKV_ERR_BAD_ARGUMENT, "accepted[0] = 4", pagedkv_commit_spec(m, acc_bad, 1, one_sampled, 1));
	EXPECT_FAIL(m, PAGEDKV_ERR_BAD_ARGUMENT, "0 accepted counts", pagedkv_commit_spec(m, NULL, 0, one_sampled, 1));
	EXPECT_FAIL(m, PAGEDKV_ERR_STEP_PENDING, "truncate", pagedkv_truncate(m, 1, 1));
	OK(pagedkv_commit_spec(m, acc_ok, 1, one_sampled, 1));
	OK(pagedkv_audit(m));
	{
		pagedkv_request_state st1;
		int32_t toks[32];
		int64_t nt1 = 0;
		OK(pagedkv_get_request_state(m, 1, &st1));
		OK(pagedkv_request_tokens(m, 1, toks, 32, &nt1));
		CHECK(st1.computed == 12 && nt1 == 13 && toks[11] == 5 && toks[12] == 9,
		      "after the spec step: computed %lld, %lld tokens, last %d %d", (long long)st1.computed,
		      (long long)nt1, toks[11], toks[12]);
		pagedkv_stats sst;
		OK(pagedkv_get_stats(m, &sst, sizeof sst));
		CHECK(sst.draft_tokens == 3 && sst.accepted_draft_tokens == 1, "draft stats %lld %lld",
		      (long long)sst.draft_tokens, (long long)sst.accepted_draft_tokens);
	}
	OK(pagedkv_truncate(m, 1, 12));
	OK(pagedkv_audit(m));

	// Operations.
	uint64_t pin = 0;
	int64_t pinned = 0;
	int32_t other[] = {50, 51, 52, 53, 54};
	EXPECT_FAIL(m, PAGEDKV_ERR_NOT_CACHED, "not cached", pagedkv_pin(m, NULL, other, 5, &pin, &pinned));
	pagedkv_namespace ns = {.tenant = "t", .tenant_len = 1};
	EXPECT_FAIL(m, PAGEDKV_ERR_NOT_CACHED, "not cached", pagedkv_pin(m, &ns, prompt, 8, &pin, &pinned));
	EXPECT_FAIL(m, PAGEDKV_ERR_BAD_ARGUMENT, "pin is NULL", pagedkv_pin(m, NULL, prompt, 8, NULL, &pinned));
	EXPECT_FAIL(m, PAGEDKV_ERR_BAD_ARGUMENT, "tokens is NULL", pagedkv_pin(m, NULL, NULL, 8, &pin, &pinned));
	// The shared prompt's 2 cached pages fit the limit; request 3's third
	// page (published by its last commit) does not.
	OK(pagedkv_pin(m, NULL, prompt, 8, &pin, &pinned));
	CHECK(pinned == 8, "pinned %lld tokens, want 8", (long long)pinned);
	int32_t longer[16];
	OK(pagedkv_request_tokens(m, 3, longer, 16, &matched));
	EXPECT_FAIL(m, PAGEDKV_ERR_PIN_LIMIT, "limit 2", pagedkv_pin(m, NULL, longer, 12, &pin, &pinned));
	EXPECT_FAIL(m, PAGEDKV_ERR_UNKNOWN_PIN, "pin", pagedkv_unpin(m, pin + 100));
	OK(pagedkv_unpin(m, pin));
	EXPECT_FAIL(m, PAGEDKV_ERR_UNKNOWN_PIN, "pin", pagedkv_unpin(m, pin));
	int64_t freed = 0;
	EXPECT_FAIL(m, PAGEDKV_ERR_BAD_ARGUMENT, "npages = -1", pagedkv_evict(m, -1, &freed));
	EXPECT_FAIL(m, PAGEDKV_ERR_BAD_ARGUMENT, "out is NULL", pagedkv_get_stats(m, NULL, sizeof st));
	pagedkv_request_state rs;
	EXPECT_FAIL(m, PAGEDKV_ERR_UNKNOWN_REQUEST, "9", pagedkv_get_request_state(m, 9, &rs));
	EXPECT_FAIL(m, PAGEDKV_ERR_BAD_ARGUMENT, "dst is NULL", pagedkv_request_tokens(m, 1, NULL, 4, &matched));

	// A smaller (older) stats struct gets the leading fields.
	int64_t first2[2] = {-1, -1};
	OK(pagedkv_get_stats(m, (pagedkv_stats *)(void *)first2, sizeof first2));
	CHECK(first2[0] == 8, "total_pages through a 2-field struct = %lld", (long long)first2[0]);

	// A Go panic comes back as PAGEDKV_ERR_INTERNAL and poisons the handle;
	// stats and destroy still work.
	CHECK(pagedkv_debug_panic(m) == PAGEDKV_ERR_INTERNAL, "debug_panic: %s", pagedkv_last_error());
	CHECK(strstr(pagedkv_last_error(), "pagedkv_debug_panic was called") != NULL, "panic message: %s",
	      pagedkv_last_error());
	CHECK(pagedkv_audit(m) == PAGEDKV_ERR_INTERNAL, "a poisoned handle answered audit");
	CHECK(strstr(pagedkv_last_error(), "poisoned") != NULL, "poisoned message: %s", pagedkv_last_error());
	OK(pagedkv_get_stats(m, &st, sizeof st));
	OK(pagedkv_destroy(m));
	CHECK(pagedkv_audit(m) == PAGEDKV_ERR_BAD_HANDLE, "a destroyed handle answered audit");
	CHECK(pagedkv_destroy(m) == PAGEDKV_ERR_BAD_HANDLE, "destroyed twice");
	checked += 5;
}

// ---- Hybrid models ----

// hybrid runs ExampleHybridManager (example_hybrid_test.go): a gpt-oss-like
// model, sliding window 128 and full attention on one pool, and checks the
// C-only mistakes of the hybrid calls.
static void hybrid(void) {
	char out[1024] = "";
	pagedkv_config cfg = {.num_pages = 64, .page_size = 16, .hash_seed = 1};
	pagedkv_layer_group groups[] = {
	    {.kind = PAGEDKV_GROUP_SLIDING, .window_tokens = 128, .num_layers = 1},
	    {.kind = PAGEDKV_GROUP_FULL, .num_layers = 1},
	};
	pagedkv_manager m = 0;
	OK(pagedkv_hybrid_create(&cfg, sizeof cfg, groups, 2, sizeof groups[0], &m));
	int64_t ng = 0;
	OK(pagedkv_hybrid_num_groups(m, &ng));
	CHECK(ng == 2, "num_groups %lld", (long long)ng);

	int32_t prompt[200];
	pagedkv_request req = prompt_request(prompt, 200);
	OK(pagedkv_add(m, 1, &req, NULL));
	uint64_t ids[] = {1};
	int32_t nt[] = {200};
	pagedkv_array copies;
	pagedkv_group_plan gp[2];
	OK(pagedkv_hybrid_reserve(m, ids, nt, 1, &copies, gp, 2));
	for (int g = 0; g < 2; g++) {
		snprintf(out + strlen(out), sizeof out - strlen(out), "group %d window_left %lld pages %d\n", g,
		         (long long)gp[g].plan.window_left, gp[g].plan.kv_indptr.data[1]);
	}
	int32_t s1[] = {7};
	OK(pagedkv_commit(m, s1, 1));
	nt[0] = 1;
	OK(pagedkv_hybrid_reserve(m, ids, nt, 1, &copies, gp, 2));
	for (int g = 0; g < 2; g++) {
		snprintf(out + strlen(out), sizeof out - strlen(out), "group %d pages %d ", g, gp[g].plan.kv_indptr.data[1]);
		print_array(out, sizeof out, "positions", gp[g].plan.positions);
		strcat(out, " ");
		print_array(out, sizeof out, "token_positions", gp[g].plan.token_positions);
		strcat(out, "\n");
		CHECK(gp[g].attn_qo_indptr.len == 0, "group %d has attn arrays", g);
	}
	int32_t s2[] = {8};
	OK(pagedkv_commit(m, s2, 1));
	pagedkv_stats st;
	OK(pagedkv_get_stats(m, &st, sizeof st));
	snprintf(out + strlen(out), sizeof out - strlen(out), "free pages %lld\n", (long long)st.free_pages);
	OK(pagedkv_audit(m));
	pagedkv_group_stats gs[2];
	OK(pagedkv_hybrid_get_group_stats(m, 0, &gs[0], sizeof gs[0]));
	OK(pagedkv_hybrid_get_group_stats(m, 1, &gs[1], sizeof gs[1]));
	CHECK(gs[0].kind == PAGEDKV_GROUP_SLIDING && gs[0].window_released_pages == 4 && gs[1].kind == PAGEDKV_GROUP_FULL &&
	          gs[1].window_released_pages == 0 && gs[0].cached_pages + gs[1].cached_pages == st.cached_pages,
	      "group stats: kinds %lld %lld, released %lld %lld, cached %lld + %lld of %lld", (long long)gs[0].kind,
	      (long long)gs[1].kind, (long long)gs[0].window_released_pages, (long long)gs[1].window_released_pages,
	      (long long)gs[0].cached_pages, (long long)gs[1].cached_pages, (long long)st.cached_pages);
	const char *want =
	    "group 0 window_left 127 pages 13\n"
	    "group 1 window_left -1 pages 13\n"
	    "group 0 pages 9 positions [136] token_positions [200]\n"
	    "group 1 pages 13 positions [200] token_positions [200]\n"
	    "free pages 38\n";
	CHECK(strcmp(out, want) == 0, "hybrid example printed\n%s\nwant\n%s", out, want);
	fputs(out, stdout);

	// Each kind of handle refuses the other kind's calls, naming it.
	pagedkv_plan plan;
	CHECK(pagedkv_reserve(m, ids, nt, 1, &plan) == PAGEDKV_ERR_BAD_HANDLE &&
	          strstr(pagedkv_last_error(), "is a hybrid manager") != NULL,
	      "reserve on a hybrid handle: %s", pagedkv_last_error());
	pagedkv_manager d = create(16, 4, 0);
	CHECK(pagedkv_hybrid_reserve(d, ids, nt, 1, &copies, gp, 2) == PAGEDKV_ERR_BAD_HANDLE &&
	          strstr(pagedkv_last_error(), "is a dense manager") != NULL,
	      "hybrid_reserve on a dense handle: %s", pagedkv_last_error());
	OK(pagedkv_destroy(d));
	CHECK(pagedkv_hybrid_reserve(m, ids, nt, 1, &copies, gp, 3) == PAGEDKV_ERR_BAD_ARGUMENT &&
	          strstr(pagedkv_last_error(), "num_groups = 3") != NULL,
	      "num_groups 3: %s", pagedkv_last_error());
	CHECK(pagedkv_hybrid_request_pages(m, 2, 1, NULL, 0, &ng) == PAGEDKV_ERR_BAD_ARGUMENT &&
	          strstr(pagedkv_last_error(), "group = 2") != NULL,
	      "group 2: %s", pagedkv_last_error());
	OK(pagedkv_destroy(m));

	// Bad groups: a failed create writes no handle.
	pagedkv_manager h = 12345;
	groups[0].kind = 9;
	CHECK(pagedkv_hybrid_create(&cfg, sizeof cfg, groups, 2, sizeof groups[0], &h) == PAGEDKV_ERR_BAD_ARGUMENT &&
	          strstr(pagedkv_last_error(), "groups[0].kind = 9") != NULL && h == 12345,
	      "kind 9: %s", pagedkv_last_error());
	groups[0].kind = PAGEDKV_GROUP_CHUNKED;
	groups[0].window_tokens = 0;
	groups[0].chunk_tokens = 20;
	CHECK(pagedkv_hybrid_create(&cfg, sizeof cfg, groups, 2, sizeof groups[0], &h) == PAGEDKV_ERR_BAD_CONFIG &&
	          strstr(pagedkv_last_error(), "ChunkTokens = 20") != NULL && h == 12345,
	      "chunk 20: %s", pagedkv_last_error());
	CHECK(pagedkv_hybrid_create(&cfg, sizeof cfg, NULL, 2, sizeof groups[0], &h) == PAGEDKV_ERR_BAD_ARGUMENT &&
	          h == 12345,
	      "NULL groups: %s", pagedkv_last_error());

	// Issue 35: 65,536 groups of 4,096 pages (38 GiB of bookkeeping) killed
	// the process; now refused before anything is allocated, naming the
	// groups, pages, bytes and limit (here memory_limit, 1 GiB).
	enum { many = 65536 };
	pagedkv_layer_group *lots = calloc(many, sizeof *lots);
	CHECK(lots != NULL, "calloc");
	for (int i = 0; i < many; i++) lots[i].num_layers = 1;
	pagedkv_config huge = {.num_pages = 4096, .page_size = 16, .memory_limit = (int64_t)1 << 30};
	CHECK(pagedkv_hybrid_create(&huge, sizeof huge, lots, many, sizeof lots[0], &h) == PAGEDKV_ERR_BAD_CONFIG &&
	          strstr(pagedkv_last_error(), "65536 groups, NumPages = 4096") != NULL &&
	          strstr(pagedkv_last_error(), "more than MemoryLimit (1073741824 bytes)") != NULL && h == 12345,
	      "65536 groups x 4096 pages: %s", pagedkv_last_error());
	// A caller of the header before memory_limit passes its smaller size.
	huge.memory_limit = 1;
	CHECK(pagedkv_hybrid_create(&huge, offsetof(pagedkv_config, memory_limit), lots, 2, sizeof lots[0], &h) ==
	          PAGEDKV_OK,
	      "cfg_size without memory_limit: %s", pagedkv_last_error());
	OK(pagedkv_destroy(h));
	free(lots);
	checked += 10;
}

// memmem-free search for a byte string in a payload.
static int contains(const uint8_t *p, int64_t n, const char *needle) {
	size_t k = strlen(needle);
	for (int64_t i = 0; i + (int64_t)k <= n; i++) {
		if (memcmp(p + i, needle, k) == 0) {
			return 1;
		}
	}
	return 0;
}

// host_memory is m's host pages, which must be want_pages of
// want_page_bytes (*page_bytes: their size).
static uint8_t *host_memory(pagedkv_manager m, int64_t want_page_bytes, int64_t want_pages, int64_t *page_bytes) {
	uint8_t *host = NULL;
	int64_t n = 0;
	OK(pagedkv_host_memory(m, &host, page_bytes, &n));
	CHECK(host != NULL && *page_bytes == want_page_bytes && n == want_pages,
	      "host memory %p, %lld bytes a page, %lld pages", (void *)host, (long long)*page_bytes, (long long)n);
	return host;
}

// add_host_hit adds req as request 2 to m, which must match 8 tokens from
// the host tier and be loading.
static void add_host_hit(pagedkv_manager m, const pagedkv_request *req) {
	int64_t matched = 0;
	int32_t loading = 0;
	OK(pagedkv_add(m, 2, req, &matched));
	OK(pagedkv_loading(m, 2, &loading));
	CHECK(matched == 8 && loading == 1, "request 2 matched %lld tokens from the host tier (want 8), loading %d",
	      (long long)matched, loading);
}

// tiers runs a Manager with a host tier and KV events through the tier
// calls: offload on eviction, host memory written by the engine, a host
// hit onloaded back (the request loads until the copies complete), the
// event payloads and cached hashes of both media; then the tier calls'
// bad inputs, and hybrid pins.
static void tiers(void) {
	pagedkv_config cfg = {.num_pages = 8, .page_size = 4, .hash_seed = 1};
	pagedkv_tier_config tc = {.host_pages = 8,
	                          .format = {.kv_layout = PAGEDKV_NHD, .dtype = PAGEDKV_DTYPE_F32, .num_kv_heads = 1,
	                                     .head_dim = 1, .num_layers = 1}};
	pagedkv_events_config ec = {.data_parallel_rank = 3};
	pagedkv_options opts = {.tiers = &tc, .tiers_size = sizeof tc, .events = &ec, .events_size = sizeof ec};
	pagedkv_manager m = 0;
	OK(pagedkv_create_ex(&cfg, sizeof cfg, &opts, sizeof opts, &m));
	int64_t page_bytes = 0, host_pages = 0;
	uint8_t *host = host_memory(m, 32, 8, &page_bytes);

	int32_t prompt[12];
	pagedkv_request req = prompt_request(prompt, 12);
	uint64_t ids[] = {1};
	int32_t nt[] = {12}, s1[] = {7};
	pagedkv_plan plan;
	int32_t rc = pagedkv_add(m, 1, &req, NULL);
	rc = rc ? rc : pagedkv_reserve(m, ids, nt, 1, &plan);
	rc = rc ? rc : pagedkv_commit(m, s1, 1);
	OK(rc);
	const uint8_t *ev = NULL;
	int64_t evn = -1;
	OK(pagedkv_drain_events(m, &ev, &evn));
	// [ts, events, 3]: a 3-array, a float64, ..., the rank last.
	CHECK(evn > 10 && ev[0] == 0x93 && ev[1] == 0xcb && ev[evn - 1] == 3 && contains(ev, evn, "BlockStored") &&
	          contains(ev, evn, "GPU"),
	      "first batch: %lld bytes", (long long)evn);
	OK(pagedkv_drain_events(m, &ev, &evn));
	CHECK(evn == 0, "a second drain found %lld bytes", (long long)evn);
	uint64_t hashes[16];
	int64_t nh = 0;
	OK(pagedkv_cached_hashes(m, PAGEDKV_MEDIUM_GPU, hashes, 16, &nh));
	CHECK(nh == 3, "%lld cached pages, want 3", (long long)nh);

	// Evict with offload: three copies down, the engine writes the host pages.
	OK(pagedkv_release(m, 1));
	int64_t freed = 0;
	OK(pagedkv_evict(m, 8, &freed)); // until 8 pages are free (or on their way)
	pagedkv_tier_copies tcs;
	OK(pagedkv_tier_copies_take(m, &tcs));
	CHECK(tcs.n == 3 && tcs.num_offloads == 3, "%lld copies, %lld offloads", (long long)tcs.n,
	      (long long)tcs.num_offloads);
	uint64_t done[8];
	for (int64_t i = 0; i < tcs.n && i < 8; i++) {
		CHECK(tcs.dirs[i] == PAGEDKV_TO_HOST && tcs.host_pages[i] >= 0 && tcs.host_pages[i] < 8, "copy %lld", (long long)i);
		memset(host + tcs.host_pages[i] * page_bytes, 0x40 + tcs.device_pages[i], (size_t)page_bytes);
		done[i] = tcs.ids[i];
	}
	OK(pagedkv_complete_tier_copies(m, done, tcs.n));
	pagedkv_tier_stats ts;
	OK(pagedkv_get_tier_stats(m, &ts, sizeof ts));
	CHECK(ts.offloaded_pages == 3 && ts.bytes_to_host == 96 && ts.in_flight == 0, "tier stats: offloaded %lld, %lld bytes",
	      (long long)ts.offloaded_pages, (long long)ts.bytes_to_host);
	OK(pagedkv_cached_hashes(m, PAGEDKV_MEDIUM_CPU, hashes, 16, &nh));
	CHECK(nh == 3, "%lld host pages cached, want 3", (long long)nh);
	OK(pagedkv_drain_events(m, &ev, &evn));
	CHECK(evn > 0 && contains(ev, evn, "BlockRemoved") && contains(ev, evn, "CPU"), "eviction batch: %lld bytes",
	      (long long)evn);

	// The same prompt again: a host hit, onloaded; the request loads until
	// the copies complete.
	add_host_hit(m, &req);
	int32_t loading = 1;
	uint64_t ids2[] = {2};
	int32_t nt2[] = {4};
	EXPECT_FAIL(m, PAGEDKV_ERR_LOADING, "onload", pagedkv_reserve(m, ids2, nt2, 1, &plan));
	OK(pagedkv_tier_copies_take(m, &tcs));
	CHECK(tcs.n == 2 && tcs.num_offloads == 0 && tcs.dirs[0] == PAGEDKV_TO_DEVICE, "%lld onloads", (long long)tcs.n);
	uint64_t up[2] = {tcs.ids[0], tcs.ids[1]};
	uint64_t twice[2] = {tcs.ids[0], tcs.ids[0]};
	uint64_t unknown[1] = {(uint64_t)1 << 40};
	EXPECT_FAIL(m, PAGEDKV_ERR_BAD_ARGUMENT, "appears twice", pagedkv_complete_tier_copies(m, twice, 2));
	EXPECT_FAIL(m, PAGEDKV_ERR_BAD_ARGUMENT, "ids[0] = 1099511627776 is not a copy in flight",
	            pagedkv_complete_tier_copies(m, unknown, 1));
	EXPECT_FAIL(m, PAGEDKV_ERR_BAD_ARGUMENT, "ids is NULL with length 2", pagedkv_complete_tier_copies(m, NULL, 2));
	OK(pagedkv_complete_tier_copies(m, up, 2));
	OK(pagedkv_loading(m, 2, &loading));
	CHECK(loading == 0, "request 2 still loading");
	OK(pagedkv_reserve(m, ids2, nt2, 1, &plan));
	OK(pagedkv_abort(m));
	pagedkv_events_stats es;
	OK(pagedkv_get_events_stats(m, &es, sizeof es));
	CHECK(es.batches == 2 && es.dropped_steps == 0, "events stats: %lld batches", (long long)es.batches);

	EXPECT_FAIL(m, PAGEDKV_ERR_BAD_ARGUMENT, "medium = 7", pagedkv_cached_hashes(m, 7, hashes, 16, &nh));
	EXPECT_FAIL(m, PAGEDKV_ERR_BAD_ARGUMENT, "dst is NULL with length 4", pagedkv_cached_hashes(m, 0, NULL, 4, &nh));
	EXPECT_FAIL(m, PAGEDKV_ERR_BAD_ARGUMENT, "timeout_ms = -1", pagedkv_tier_flush(m, -1));
	EXPECT_FAIL(m, PAGEDKV_ERR_BAD_ARGUMENT, "out is NULL", pagedkv_tier_copies_take(m, NULL));
	EXPECT_FAIL(m, PAGEDKV_ERR_BAD_ARGUMENT, "required", pagedkv_drain_events(m, NULL, &evn));
	EXPECT_FAIL(m, PAGEDKV_ERR_UNKNOWN_REQUEST, "request 9", pagedkv_loading(m, 9, &loading));
	EXPECT_FAIL(m, PAGEDKV_ERR_BAD_CONFIG, "drains its KV events", pagedkv_events_endpoint(m, 0, NULL, 0, &nh));
	OK(pagedkv_tier_flush(m, 1000));
	OK(pagedkv_audit(m));
	OK(pagedkv_destroy(m));

	// A manager without tiers or events refuses their calls.
	m = create(8, 4, 0);
	EXPECT_FAIL(m, PAGEDKV_ERR_BAD_CONFIG, "has no tiers", pagedkv_tier_copies_take(m, &tcs));
	EXPECT_FAIL(m, PAGEDKV_ERR_BAD_CONFIG, "has no KV events", pagedkv_drain_events(m, &ev, &evn));
	OK(pagedkv_get_tier_stats(m, &ts, sizeof ts));
	CHECK(ts.host_pages == 0, "tier stats without tiers");
	OK(pagedkv_destroy(m));

	// Caller-provided host memory is used as is.
	static uint8_t mem[8 * 32];
	tc.host_memory = mem;
	tc.host_memory_len = sizeof mem;
	opts.events = NULL;
	opts.events_size = 0;
	OK(pagedkv_create_ex(&cfg, sizeof cfg, &opts, sizeof opts, &m));
	OK(pagedkv_host_memory(m, &host, &page_bytes, &host_pages));
	CHECK(host == mem, "host memory %p, the caller's is %p", (void *)host, (void *)mem);
	OK(pagedkv_destroy(m));

	// Bad options: a failed create writes no handle and opens nothing.
	struct {
		const char *name;
		int32_t code;
		const char *needle;
	} cases[] = {
	    {"opts_size", PAGEDKV_ERR_BAD_ARGUMENT, "opts_size = 8"},
	    {"tiers_size", PAGEDKV_ERR_BAD_ARGUMENT, "opts.tiers_size = 4"},
	    {"dtype", PAGEDKV_ERR_BAD_ARGUMENT, "tiers.format.dtype = 9"},
	    {"host_memory", PAGEDKV_ERR_BAD_ARGUMENT, "tiers.host_memory is NULL with host_memory_len = 256"},
	    {"host_memory_len", PAGEDKV_ERR_BAD_CONFIG, "Memory has 100 bytes"},
	    {"redis without format", PAGEDKV_ERR_BAD_CONFIG, "needs tiers.format"},
	    {"redis namespace", PAGEDKV_ERR_BAD_CONFIG, "Namespace = \"\""},
	    {"redis size", PAGEDKV_ERR_BAD_ARGUMENT, "redis_size = 1"},
	    {"events", PAGEDKV_ERR_BAD_ARGUMENT, "events.queue_batches = -1"},
	    {"host pages", PAGEDKV_ERR_BAD_ARGUMENT, "tiers.host_pages = -3"},
	    {"events mode", PAGEDKV_ERR_BAD_ARGUMENT, "events.mode = 7"},
	    {"topic without endpoint", PAGEDKV_ERR_BAD_ARGUMENT, "without an endpoint"},
	};
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		pagedkv_tier_config t = {.host_pages = 8, .format = tc.format};
		pagedkv_redis_config r = {.addr = "127.0.0.1:1", .addr_len = 11};
		pagedkv_events_config e = {0};
		pagedkv_options o = {.tiers = &t, .tiers_size = sizeof t};
		size_t osize = sizeof o;
		switch (i) {
		case 0: osize = 8; break;
		case 1: o.tiers_size = 4; break;
		case 2: t.format.dtype = 9; break;
		case 3: t.host_memory_len = 256; break;
		case 4: t.host_memory = mem; t.host_memory_len = 100; break;
		case 5: t.format = (pagedkv_page_format){0}; t.redis = &r; t.redis_size = sizeof r; break;
		case 6: t.redis = &r; t.redis_size = sizeof r; break;
		case 7: t.redis = &r; t.redis_size = 1; break;
		case 8: e.queue_batches = -1; o.events = &e; o.events_size = sizeof e; break;
		case 9: t.host_pages = -3; t.format = (pagedkv_page_format){0}; break;
		case 10: e.mode = 7; o.events = &e; o.events_size = sizeof e; break;
		case 11: e.topic = "kv"; e.topic_len = 2; o.events = &e; o.events_size = sizeof e; break;
		}
		pagedkv_manager h = 12345;
		int32_t rc = pagedkv_create_ex(&cfg, sizeof cfg, &o, osize, &h);
		CHECK(rc == cases[i].code && strstr(pagedkv_last_error(), cases[i].needle) != NULL && h == 12345,
		      "options case %s: rc %d (%s)", cases[i].name, rc, pagedkv_last_error());
		checked++;
	}

	// A HybridManager takes events and pins (its tiers: hybrid_tiers).
	pagedkv_layer_group groups[] = {
	    {.kind = PAGEDKV_GROUP_SLIDING, .window_tokens = 8, .num_layers = 1},
	    {.kind = PAGEDKV_GROUP_FULL, .num_layers = 1},
	};
	pagedkv_config hcfg = {.num_pages = 32, .page_size = 4, .hash_seed = 1};
	pagedkv_manager h = 12345;
	pagedkv_options hopts = {.events = &ec, .events_size = sizeof ec};
	OK(pagedkv_hybrid_create_ex(&hcfg, sizeof hcfg, groups, 2, sizeof groups[0], &hopts, sizeof hopts, &h));
	OK(pagedkv_add(h, 1, &req, NULL));
	pagedkv_array copies;
	pagedkv_group_plan gp[2];
	OK(pagedkv_hybrid_reserve(h, ids, nt, 1, &copies, gp, 2));
	OK(pagedkv_commit(h, s1, 1));
	OK(pagedkv_drain_events(h, &ev, &evn));
	CHECK(evn > 0 && contains(ev, evn, "group_idx") && contains(ev, evn, "sliding_window"), "hybrid batch %lld bytes",
	      (long long)evn);
	uint64_t pin = 0;
	int64_t pinned = 0;
	pagedkv_namespace ns = {0};
	OK(pagedkv_pin(h, &ns, prompt, 12, &pin, &pinned));
	pagedkv_group_stats gs;
	OK(pagedkv_hybrid_get_group_stats(h, 1, &gs, sizeof gs));
	CHECK(pinned == 12 && gs.pinned_pages == 3, "hybrid pin: %lld tokens, group 1 pins %lld pages", (long long)pinned,
	      (long long)gs.pinned_pages);
	OK(pagedkv_unpin(h, pin));
	CHECK(pagedkv_unpin(h, pin) == PAGEDKV_ERR_UNKNOWN_PIN, "unpin twice: %s", pagedkv_last_error());
	CHECK(pagedkv_cached_hashes(h, 0, hashes, 16, &nh) == PAGEDKV_ERR_BAD_HANDLE, "cached_hashes on a hybrid handle");
	OK(pagedkv_audit(h));
	OK(pagedkv_destroy(h));
	checked += 4;
}

// EXPECT_FAIL_H is EXPECT_FAIL for a hybrid handle (take needs a dense
// one): the pool's stats, tier stats and both groups' stats must not change.
typedef struct {
	pagedkv_stats st;
	pagedkv_tier_stats ts;
	pagedkv_group_stats gs[2];
} hsnapshot;

static void htake(pagedkv_manager h, hsnapshot *s) {
	memset(s, 0, sizeof *s);
	OK(pagedkv_get_stats(h, &s->st, sizeof s->st));
	OK(pagedkv_get_tier_stats(h, &s->ts, sizeof s->ts));
	OK(pagedkv_hybrid_get_group_stats(h, 0, &s->gs[0], sizeof s->gs[0]));
	OK(pagedkv_hybrid_get_group_stats(h, 1, &s->gs[1], sizeof s->gs[1]));
}

#define EXPECT_FAIL_H(h, want, needle, call) EXPECT_FAIL_WITH(hsnapshot, htake, h, want, needle, call)

// group_tier_sums sums the groups' tier counters of a hybrid handle.
static void group_tier_sums(pagedkv_manager h, int64_t *hit, int64_t *off, int64_t *on) {
	*hit = *off = *on = 0;
	for (int64_t g = 0; g < 2; g++) {
		pagedkv_group_stats gs;
		OK(pagedkv_hybrid_get_group_stats(h, g, &gs, sizeof gs));
		*hit += gs.host_hit_tokens + gs.remote_hit_tokens;
		*off += gs.offloaded_pages;
		*on += gs.onloaded_pages;
	}
}

// hybrid_offload computes request 1 (n prompt tokens) in hybrid h,
// releases it, evicts its cached pages with offload and takes the tier
// copies planned.
static pagedkv_tier_copies hybrid_offload(pagedkv_manager h, int32_t *prompt, int32_t n) {
	uint64_t ids[] = {1};
	int32_t nt[] = {n}, s1[] = {7};
	pagedkv_request req = prompt_request(prompt, n);
	pagedkv_group_plan gp[2];
	pagedkv_array copies;
	OK(pagedkv_add(h, 1, &req, NULL));
	OK(pagedkv_hybrid_reserve(h, ids, nt, 1, &copies, gp, 2));
	OK(pagedkv_commit(h, s1, 1));
	OK(pagedkv_release(h, 1));
	int64_t freed = 0;
	OK(pagedkv_evict(h, 16, &freed));
	pagedkv_tier_copies tcs;
	OK(pagedkv_tier_copies_take(h, &tcs));
	return tcs;
}

// hybrid_tiers runs a HybridManager with a host tier through the same tier
// calls as tiers(): offload on eviction (copies of pool pages, written by
// the engine into host memory), a host hit onloaded in both groups, the
// group stats' tier fields (and the old, smaller struct), the host hashes;
// then the hybrid's own refusals.
static void hybrid_tiers(void) {
	pagedkv_layer_group groups[] = {
	    {.kind = PAGEDKV_GROUP_SLIDING, .window_tokens = 8, .num_layers = 1},
	    {.kind = PAGEDKV_GROUP_FULL, .num_layers = 1},
	};
	pagedkv_config cfg = {.num_pages = 16, .page_size = 4, .hash_seed = 1};
	pagedkv_tier_config tc = {.host_pages = 16,
	                          .format = {.kv_layout = PAGEDKV_NHD, .dtype = PAGEDKV_DTYPE_F32, .num_kv_heads = 1,
	                                     .head_dim = 1, .num_layers = 2}};
	pagedkv_options opts = {.tiers = &tc, .tiers_size = sizeof tc};
	pagedkv_manager h = 0;
	OK(pagedkv_hybrid_create_ex(&cfg, sizeof cfg, groups, 2, sizeof groups[0], &opts, sizeof opts, &h));
	int64_t page_bytes = 0, host_pages = 16;
	uint8_t *host = host_memory(h, 64, 16, &page_bytes);

	// Request 1 (12 tokens: 3 pages a group) computes, is released, and
	// its cached pages are evicted with offload.
	int32_t prompt[12];
	pagedkv_tier_copies tcs = hybrid_offload(h, prompt, 12);
	pagedkv_request req = prompt_request(prompt, 12); // request 2's, below
	int32_t s1[] = {7};
	pagedkv_group_plan gp[2];
	pagedkv_array copies;
	CHECK(tcs.n == 6 && tcs.num_offloads == 6, "hybrid: %lld copies, %lld offloads, want 6 (3 pages a group)",
	      (long long)tcs.n, (long long)tcs.num_offloads);
	uint64_t done[16];
	for (int64_t i = 0; i < tcs.n && i < 16; i++) {
		CHECK(tcs.dirs[i] == PAGEDKV_TO_HOST && tcs.host_pages[i] >= 0 && tcs.host_pages[i] < 16 &&
		          tcs.device_pages[i] >= 0 && tcs.device_pages[i] < 16,
		      "hybrid copy %lld", (long long)i);
		memset(host + tcs.host_pages[i] * page_bytes, 0x40 + tcs.device_pages[i], (size_t)page_bytes);
		done[i] = tcs.ids[i];
	}
	OK(pagedkv_complete_tier_copies(h, done, tcs.n < 16 ? tcs.n : 16));
	pagedkv_tier_stats ts;
	OK(pagedkv_get_tier_stats(h, &ts, sizeof ts));
	int64_t hit, off, on;
	group_tier_sums(h, &hit, &off, &on);
	CHECK(ts.offloaded_pages == 6 && off == 6 && ts.bytes_to_host == 6 * 64 && ts.in_flight == 0,
	      "hybrid tier stats: offloaded %lld (groups %lld), %lld bytes", (long long)ts.offloaded_pages, (long long)off,
	      (long long)ts.bytes_to_host);
	uint64_t hashes[16];
	int64_t nh = 0;
	OK(pagedkv_cached_hashes(h, PAGEDKV_MEDIUM_CPU, hashes, 16, &nh));
	CHECK(nh == 6, "hybrid: %lld host pages cached, want 6", (long long)nh);

	// The same prompt: a host hit of 8 tokens in both groups, onloaded.
	add_host_hit(h, &req);
	int32_t loading = 1;
	uint64_t ids2[] = {2};
	int32_t nt2[] = {4};
	EXPECT_FAIL_H(h, PAGEDKV_ERR_LOADING, "onload", pagedkv_hybrid_reserve(h, ids2, nt2, 1, &copies, gp, 2));
	OK(pagedkv_tier_copies_take(h, &tcs));
	CHECK(tcs.n == 4 && tcs.num_offloads == 0, "hybrid: %lld onloads, want 4 (2 a group)", (long long)tcs.n);
	uint64_t unknown[1] = {(uint64_t)1 << 40};
	EXPECT_FAIL_H(h, PAGEDKV_ERR_BAD_ARGUMENT, "ids[0] = 1099511627776 is not a copy in flight",
	            pagedkv_complete_tier_copies(h, unknown, 1));
	EXPECT_FAIL_H(h, PAGEDKV_ERR_BAD_ARGUMENT, "ids is NULL with length 2", pagedkv_complete_tier_copies(h, NULL, 2));
	for (int64_t i = 0; i < tcs.n && i < 16; i++) {
		CHECK(tcs.dirs[i] == PAGEDKV_TO_DEVICE && host[tcs.host_pages[i] * page_bytes] >= 0x40,
		      "hybrid onload %lld reads host page %d", (long long)i, tcs.host_pages[i]);
		done[i] = tcs.ids[i];
	}
	OK(pagedkv_complete_tier_copies(h, done, tcs.n < 16 ? tcs.n : 16));
	OK(pagedkv_loading(h, 2, &loading));
	CHECK(loading == 0, "hybrid request 2 still loading");
	group_tier_sums(h, &hit, &off, &on);
	OK(pagedkv_get_tier_stats(h, &ts, sizeof ts));
	CHECK(on == 4 && ts.onloaded_pages == 4 && hit == 16 && ts.host_hit_tokens == 16,
	      "hybrid onloads: groups %lld pages %lld hit tokens, pool %lld pages %lld hit tokens", (long long)on,
	      (long long)hit, (long long)ts.onloaded_pages, (long long)ts.host_hit_tokens);
	OK(pagedkv_hybrid_reserve(h, ids2, nt2, 1, &copies, gp, 2));
	OK(pagedkv_commit(h, s1, 1));

	// A caller built against the struct before the tier fields passes its
	// size: the fields it knows are written, nothing past them.
	struct {
		int64_t old[9];
		int64_t canary;
	} small;
	memset(&small, 0x5a, sizeof small);
	OK(pagedkv_hybrid_get_group_stats(h, 1, (pagedkv_group_stats *)&small, sizeof small.old));
	pagedkv_group_stats full;
	OK(pagedkv_hybrid_get_group_stats(h, 1, &full, sizeof full));
	CHECK(small.old[0] == PAGEDKV_GROUP_FULL && small.old[1] == full.cached_pages && small.old[8] == full.pinned_pages &&
	          small.canary == 0x5a5a5a5a5a5a5a5a && full.host_hit_tokens == 8 && full.onloaded_pages == 2,
	      "old-size group stats: kind %lld cached %lld canary %llx; host hit %lld onloaded %lld",
	      (long long)small.old[0], (long long)small.old[1], (unsigned long long)small.canary,
	      (long long)full.host_hit_tokens, (long long)full.onloaded_pages);

	// Hybrid refusals and bad inputs, each named.
	EXPECT_FAIL_H(h, PAGEDKV_ERR_BAD_HANDLE, "PAGEDKV_MEDIUM_CPU works",
	            pagedkv_cached_hashes(h, PAGEDKV_MEDIUM_GPU, hashes, 16, &nh));
	EXPECT_FAIL_H(h, PAGEDKV_ERR_BAD_ARGUMENT, "medium = 7", pagedkv_cached_hashes(h, 7, hashes, 16, &nh));
	EXPECT_FAIL_H(h, PAGEDKV_ERR_BAD_ARGUMENT, "out is NULL", pagedkv_tier_copies_take(h, NULL));
	EXPECT_FAIL_H(h, PAGEDKV_ERR_UNKNOWN_REQUEST, "request 9", pagedkv_loading(h, 9, &loading));
	EXPECT_FAIL_H(h, PAGEDKV_ERR_BAD_ARGUMENT, "loading is NULL", pagedkv_loading(h, 2, NULL));
	EXPECT_FAIL_H(h, PAGEDKV_ERR_BAD_ARGUMENT, "required", pagedkv_host_memory(h, NULL, &page_bytes, &host_pages));
	EXPECT_FAIL_H(h, PAGEDKV_ERR_BAD_ARGUMENT, "timeout_ms = -1", pagedkv_tier_flush(h, -1));
	EXPECT_FAIL_H(h, PAGEDKV_ERR_BAD_CONFIG, "has no KV events", pagedkv_drain_events(h, (const uint8_t **)&host, &nh));
	OK(pagedkv_tier_flush(h, 1000));
	OK(pagedkv_audit(h));
	OK(pagedkv_destroy(h));

	// Events with a hybrid's host tier: each group's host pages are
	// announced (medium "CPU", the group's group_idx; the Go tests decode
	// them), so a write-through offload of a published page drains as a
	// batch.
	pagedkv_events_config ec = {0};
	opts.events = &ec;
	opts.events_size = sizeof ec;
	h = 12345;
	OK(pagedkv_hybrid_create_ex(&cfg, sizeof cfg, groups, 2, sizeof groups[0], &opts, sizeof opts, &h));
	{
		int32_t ep[8] = {1, 2, 3, 4, 5, 6, 7, 8};
		pagedkv_tier_copies etcs = hybrid_offload(h, ep, 8);
		CHECK(etcs.n == 4 && etcs.num_offloads == 4, "hybrid with events: %lld copies, want 4 offloads (2 pages a group)",
		      (long long)etcs.n);
		OK(pagedkv_complete_tier_copies(h, etcs.ids, etcs.n));
		const uint8_t *ev = NULL;
		int64_t evn = 0, batches = 0, cpu = 0;
		for (;;) {
			OK(pagedkv_drain_events(h, &ev, &evn));
			if (evn == 0)
				break;
			batches++;
			cpu += contains(ev, evn, "\xa3" "CPU"); /* msgpack fixstr "CPU" */
		}
		CHECK(batches > 0 && cpu > 0, "hybrid with tiers and events drained %lld batches, %lld CPU media",
		      (long long)batches, (long long)cpu);
		OK(pagedkv_audit(h));
	}
	OK(pagedkv_destroy(h));
	// A bad tier option on a hybrid create is named as on a dense one.
	h = 12345;
	tc.host_pages = -3;
	opts.events = NULL;
	opts.events_size = 0;
	CHECK(pagedkv_hybrid_create_ex(&cfg, sizeof cfg, groups, 2, sizeof groups[0], &opts, sizeof opts, &h) ==
	              PAGEDKV_ERR_BAD_ARGUMENT &&
	          strstr(pagedkv_last_error(), "hybrid_create: tiers.host_pages = -3") != NULL && h == 12345,
	      "hybrid with host_pages -3: %s", pagedkv_last_error());
	checked += 13;
}

/* Step buffers from C: size the layout, bind aligned_alloc'ed memory, and
 * find the step's kv_indptr and padded block_tables at their rows' offsets,
 * where the plan points. */
static void step_buffers(void) {
	enum { STRIDE = 24 };
	pagedkv_config cfg = {.num_pages = 64, .page_size = 4, .hash_seed = 1, .block_tables_stride = STRIDE};
	pagedkv_manager m = 0;
	OK(pagedkv_create(&cfg, sizeof cfg, &m));
	pagedkv_step_capacities caps = {4, 64, 32, 2};
	int64_t n = 0, size = 0;
	OK(pagedkv_step_layout(m, &caps, sizeof caps, NULL, 0, &n, &size));
	pagedkv_step_row rows[64];
	CHECK(n > 0 && n <= 64 && size % PAGEDKV_STEP_ALIGN == 0, "step_layout: %lld rows, %lld bytes", (long long)n,
	      (long long)size);
	OK(pagedkv_step_layout(m, &caps, sizeof caps, rows, 64, &n, &size));
	unsigned char *mem = aligned_alloc(64, (size_t)(size + 63) / 64 * 64);
	EXPECT_FAIL(m, PAGEDKV_ERR_BAD_ARGUMENT, "is not a multiple of 16",
	            pagedkv_bind_step_buffers(m, mem + 4, size, &caps, sizeof caps));
	EXPECT_FAIL(m, PAGEDKV_ERR_BAD_ARGUMENT, "the layout needs",
	            pagedkv_bind_step_buffers(m, mem, size - 16, &caps, sizeof caps));
	OK(pagedkv_bind_step_buffers(m, mem, size, &caps, sizeof caps));
	int32_t prompt[10] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
	pagedkv_request req = prompt_request(prompt, 10);
	OK(pagedkv_add(m, 1, &req, NULL));
	uint64_t id = 1;
	int32_t nt = 10;
	pagedkv_plan plan;
	OK(pagedkv_reserve(m, &id, &nt, 1, &plan));
	const int32_t *kv = NULL, *btr = NULL;
	int64_t btcap = 0;
	for (int64_t i = 0; i < n; i++) {
		if (rows[i].array == PAGEDKV_STEP_KV_INDPTR && rows[i].group == 0) {
			kv = (const int32_t *)(mem + rows[i].offset);
		}
		if (rows[i].array == PAGEDKV_STEP_BLOCK_TABLES && rows[i].group == 0) {
			btr = (const int32_t *)(mem + rows[i].offset);
			btcap = rows[i].cap;
		}
	}
	CHECK(kv == plan.kv_indptr.data && kv[0] == 0 && kv[1] == 3, "kv_indptr at %p, plan's at %p", (const void *)kv,
	      (const void *)plan.kv_indptr.data);
	pagedkv_block_tables bt;
	OK(pagedkv_get_block_tables(m, 0, &bt, sizeof bt));
	CHECK(btr != NULL && btcap == 4 * STRIDE && bt.block_tables.data == btr && bt.block_tables.len == STRIDE &&
	          bt.stride == STRIDE, "block_tables row at %p (cap %lld), plan's at %p (len %lld, stride %lld)",
	      (const void *)btr, (long long)btcap, (const void *)bt.block_tables.data, (long long)bt.block_tables.len,
	      (long long)bt.stride);
	for (int j = 0; j < STRIDE; j++) {
		int32_t want = j < 3 ? plan.kv_page_indices.data[j] : PAGEDKV_BLOCK_TABLES_PAD;
		CHECK(btr[j] == want, "block_tables row [%d] = %d, want %d", j, btr[j], want);
	}
	const int32_t *header = (const int32_t *)mem;
	CHECK(header[0] == 1 && header[1] == 10 && header[3] == 1 && header[4] == 1, "header %d %d %d %d %d", header[0],
	      header[1], header[2], header[3], header[4]);
	OK(pagedkv_commit(m, NULL, 0));
	uint64_t ids2 = 2;
	req = prompt_request(prompt, 10);
	OK(pagedkv_add(m, 2, &req, NULL));
	int32_t nbig = 72; /* 8 of its 80 tokens hit request 1's pages */
	int32_t big[70] = {0};
	OK(pagedkv_extend(m, 2, big, 70));
	EXPECT_FAIL(m, PAGEDKV_ERR_BAD_ARGUMENT, "MaxTokens = 64", pagedkv_reserve(m, &ids2, &nbig, 1, &plan));
	OK(pagedkv_unbind_step_buffers(m));
	OK(pagedkv_destroy(m));
	free(mem); /* after unbind (or destroy) the library never touches it */
}

// ---- Padded block tables (pagedkv_get_block_tables) ----

// padded runs 10^4 randomized steps (adds with shared prompt families,
// chunked prefill, decode, preemption under a small pool, resume, aborted
// steps, releases) on a sliding-window manager with block_tables_stride
// 16, and after every reserve checks that each row of block_tables names
// the plan's kv_page_indices of that request in order, padded with
// PAGEDKV_BLOCK_TABLES_PAD, and that seq_lens covers exactly the row.
static uint64_t lcg = 12345;
static uint32_t rnd(uint32_t n) {
	lcg = lcg * 6364136223846793005ULL + 1442695040888963407ULL;
	return (uint32_t)(lcg >> 33) % n;
}

static void padded(void) {
	enum { STRIDE = 16, PS = 4, LIVE = 6 };
	pagedkv_config cfg = {.num_pages = 20, .page_size = PS, .window_tokens = 10, .hash_seed = 1, .block_tables_stride = STRIDE};
	pagedkv_manager m = 0;
	OK(pagedkv_create(&cfg, sizeof cfg, &m));
	uint64_t live[LIVE];
	int nlive = 0, steps = 0, refused = 0, preempted = 0;
	uint64_t next = 1;
	pagedkv_plan plan;
	pagedkv_block_tables bt;
	while (steps < 10000) {
		if (nlive < LIVE && rnd(3) == 0) {
			int32_t prompt[40];
			int n = 1 + (int)rnd(40), fam = (int)rnd(3);
			for (int i = 0; i < n; i++) {
				prompt[i] = fam * 100 + i;
			}
			pagedkv_request req = {0};
			req.prompt = prompt;
			req.prompt_len = n;
			OK(pagedkv_add(m, next, &req, NULL));
			live[nlive++] = next++;
			continue;
		}
		uint64_t ids[LIVE];
		int32_t nt[LIVE];
		int n = 0;
		for (int i = 0; i < nlive; i++) {
			pagedkv_request_state st;
			OK(pagedkv_get_request_state(m, live[i], &st));
			if (!st.running) {
				if (rnd(4) == 0 && pagedkv_resume(m, live[i], NULL) == PAGEDKV_OK) {
					continue;
				}
				continue;
			}
			if (st.num_tokens > st.computed) {
				ids[n] = live[i];
				nt[n++] = 1 + (int32_t)rnd((uint32_t)(st.num_tokens - st.computed < 8 ? st.num_tokens - st.computed : 8));
			}
		}
		if (n == 0) {
			if (nlive > 0) { // nothing to run: finish the oldest
				OK(pagedkv_release(m, live[0]));
				live[0] = live[--nlive];
			}
			continue;
		}
		int32_t rc = pagedkv_reserve(m, ids, nt, n, &plan);
		if (rc == PAGEDKV_ERR_OUT_OF_PAGES) {
			OK(pagedkv_preempt(m, ids[rnd((uint32_t)n)]));
			preempted++;
			continue;
		}
		if (rc == PAGEDKV_ERR_BAD_ARGUMENT) { // more pages than the stride
			CHECK(strstr(pagedkv_last_error(), "more than Config.BlockTablesStride = 16") != NULL, "reserve: %s", pagedkv_last_error());
			OK(pagedkv_release(m, ids[0]));
			for (int i = 0; i < nlive; i++) {
				if (live[i] == ids[0]) {
					live[i] = live[--nlive];
					break;
				}
			}
			refused++;
			continue;
		}
		OK(rc);
		OK(pagedkv_get_block_tables(m, 0, &bt, sizeof bt));
		CHECK(bt.stride == STRIDE && bt.max_seq_len == STRIDE * PS && bt.block_tables.len == (int64_t)n * STRIDE,
		      "step %d: block_tables len %lld stride %lld max_seq_len %lld", steps, (long long)bt.block_tables.len,
		      (long long)bt.stride, (long long)bt.max_seq_len);
		for (int b = 0; b < n && bt.block_tables.len == (int64_t)n * STRIDE; b++) {
			const int32_t *row = bt.block_tables.data + b * STRIDE;
			int32_t lo = plan.kv_indptr.data[b], hi = plan.kv_indptr.data[b + 1];
			for (int32_t l = 0; l < STRIDE; l++) {
				int32_t want = l < hi - lo ? plan.kv_page_indices.data[lo + l] : PAGEDKV_BLOCK_TABLES_PAD;
				CHECK(row[l] == want, "step %d request %d: block_tables[%d] = %d, want %d", steps, b, l, row[l], want);
			}
			CHECK((plan.seq_lens.data[b] + PS - 1) / PS == hi - lo, "step %d request %d: seq_lens %d for %d pages", steps,
			      b, plan.seq_lens.data[b], hi - lo);
		}
		steps++;
		if (rnd(10) == 0) {
			OK(pagedkv_abort(m));
			continue;
		}
		int32_t sampled[LIVE];
		for (int b = 0; b < n; b++) {
			pagedkv_request_state st;
			OK(pagedkv_get_request_state(m, ids[b], &st));
			sampled[b] = (st.computed + nt[b] == st.num_tokens && st.num_tokens < 60) ? (int32_t)rnd(90) : -1;
		}
		OK(pagedkv_commit(m, sampled, n));
		for (int i = 0; i < nlive; i++) {
			pagedkv_request_state st;
			OK(pagedkv_get_request_state(m, live[i], &st));
			if (st.running && st.num_tokens >= 60 && st.computed == st.num_tokens) {
				OK(pagedkv_release(m, live[i]));
				live[i--] = live[--nlive];
			}
		}
	}
	CHECK(preempted > 0, "no preemption in %d steps", steps);
	OK(pagedkv_audit(m));
	OK(pagedkv_destroy(m));
	printf("padded block tables: %d steps checked, %d preemptions, %d refused past the stride\n", steps, preempted, refused);
}

// ---- Cache reads and writes ----

// cache_usage runs the example's two requests and checks their reads and
// writes: request 1 computes 40 tokens and writes its 2 full pages (32
// tokens), request 2 reads them from the device cache; request 1's usage
// is read once after its release; the totals are both summed; a short
// struct gets the fields it has; bad input changes nothing.
static void cache_usage(void) {
	pagedkv_manager m = create(64, 16, 0);
	int32_t prompt[40];
	pagedkv_request req = prompt_request(prompt, 40);
	uint64_t ids1[] = {1};
	int32_t nt1[] = {40}, s1[] = {7};
	pagedkv_plan plan;
	OK(pagedkv_add(m, 1, &req, NULL));
	OK(pagedkv_reserve(m, ids1, nt1, 1, &plan));
	OK(pagedkv_commit(m, s1, 1));
	int64_t matched = -1;
	OK(pagedkv_add(m, 2, &req, &matched));
	pagedkv_cache_usage u1, u2, tot;
	OK(pagedkv_get_cache_usage(m, 1, &u1, sizeof u1));
	OK(pagedkv_get_cache_usage(m, 2, &u2, sizeof u2));
	CHECK(u1.read_tokens == 0 && u1.write_tokens == 32, "request 1: read %lld, wrote %lld; want 0, 32",
	      (long long)u1.read_tokens, (long long)u1.write_tokens);
	CHECK(matched == 32 && u2.read_tokens == 32 && u2.device_read_tokens == 32 && u2.host_read_tokens == 0 &&
	          u2.disk_read_tokens == 0 && u2.remote_read_tokens == 0 && u2.write_tokens == 0 && u2.dropped == 0,
	      "request 2: matched %lld, read %lld (device %lld), wrote %lld", (long long)matched,
	      (long long)u2.read_tokens, (long long)u2.device_read_tokens, (long long)u2.write_tokens);
	OK(pagedkv_release(m, 1));
	pagedkv_cache_usage after;
	OK(pagedkv_get_cache_usage(m, 1, &after, sizeof after));
	CHECK(memcmp(&after, &u1, sizeof u1) == 0, "request 1's usage changed with its release");
	EXPECT_FAIL(m, PAGEDKV_ERR_UNKNOWN_REQUEST, "request 1", pagedkv_get_cache_usage(m, 1, &after, sizeof after));
	EXPECT_FAIL(m, PAGEDKV_ERR_UNKNOWN_REQUEST, "request 9", pagedkv_get_cache_usage(m, 9, &after, sizeof after));
	EXPECT_FAIL(m, PAGEDKV_ERR_BAD_ARGUMENT, "out is NULL", pagedkv_get_cache_usage(m, 2, NULL, sizeof after));
	EXPECT_FAIL(m, PAGEDKV_ERR_BAD_ARGUMENT, "out is NULL", pagedkv_get_cache_usage_totals(m, NULL, sizeof tot));
	EXPECT_FAIL(m, PAGEDKV_ERR_BAD_HANDLE, "987654", pagedkv_get_cache_usage(987654, 2, &after, sizeof after));
	EXPECT_FAIL(m, PAGEDKV_ERR_BAD_HANDLE, "987654", pagedkv_get_cache_usage_totals(987654, &tot, sizeof tot));
	OK(pagedkv_get_cache_usage_totals(m, &tot, sizeof tot));
	CHECK(tot.read_tokens == 32 && tot.device_read_tokens == 32 && tot.write_tokens == 32 && tot.dropped == 0,
	      "totals: read %lld, wrote %lld, dropped %lld", (long long)tot.read_tokens, (long long)tot.write_tokens,
	      (long long)tot.dropped);
	// An older caller's struct of one field gets that field only.
	int64_t short_usage[2] = {-1, -1};
	OK(pagedkv_get_cache_usage_totals(m, (pagedkv_cache_usage *)short_usage, sizeof short_usage[0]));
	CHECK(short_usage[0] == 32 && short_usage[1] == -1, "a one-field struct got %lld, %lld",
	      (long long)short_usage[0], (long long)short_usage[1]);
	OK(pagedkv_destroy(m));
}

// serve_one adds request id on prompt [n] with retention ranges [nr],
// computes it, and releases it; it returns the tokens the cache served.
static int64_t serve_one(pagedkv_manager m, uint64_t id, const int32_t *prompt, int64_t n, int32_t priority,
                         const pagedkv_retention_range *ranges, int64_t nr) {
	pagedkv_request req = {0};
	req.prompt = prompt;
	req.prompt_len = n;
	req.priority = priority;
	int64_t matched = 0;
	OK(pagedkv_add(m, id, &req, &matched));
	OK(pagedkv_set_retention(m, id, ranges, nr, sizeof(pagedkv_retention_range)));
	int32_t nt = (int32_t)(n - matched), sampled = 1;
	pagedkv_plan plan;
	OK(pagedkv_reserve(m, &id, &nt, 1, &plan));
	OK(pagedkv_commit(m, &sampled, 1));
	OK(pagedkv_release(m, id));
	return matched;
}

// Retention ranges order eviction over request priorities until their
// duration lapses on the caller's clock; TTL pins lapse by themselves and
// keep the pin budget.
static void retention(void) {
	pagedkv_config cfg = {.num_pages = 8, .page_size = 4, .priorities = 3, .hash_seed = 1, .pin_budget = 0.25};
	pagedkv_manager m = 0;
	OK(pagedkv_create(&cfg, sizeof cfg, &m));
	OK(pagedkv_set_clock(m, 0));
	int32_t a[9], b[9];
	for (int i = 0; i < 9; i++) {
		a[i] = 100 + i;
		b[i] = 200 + i;
	}
	pagedkv_retention_range keep = {.start = 0, .end = 0, .priority = 2, .duration_ms = 10000};
	serve_one(m, 1, a, 9, 0, &keep, 1);
	serve_one(m, 2, b, 9, 1, NULL, 0);
	pagedkv_stats st;
	int64_t freed = 0;
	OK(pagedkv_get_stats(m, &st, sizeof st));
	OK(pagedkv_evict(m, st.free_pages + 2, &freed));
	CHECK(freed == 2, "evicted %lld pages, want 2", (long long)freed);
	CHECK(serve_one(m, 3, a, 9, 0, NULL, 0) == 8, "the retained prompt went before the level-1 one");

	// Refused by name, changing nothing.
	pagedkv_request live = {0};
	live.prompt = a;
	live.prompt_len = 9;
	OK(pagedkv_add(m, 7, &live, NULL));
	pagedkv_retention_range bad = keep;
	bad.priority = 5;
	EXPECT_FAIL(m, PAGEDKV_ERR_BAD_ARGUMENT, "priority 5", pagedkv_set_retention(m, 7, &bad, 1, sizeof bad));
	EXPECT_FAIL(m, PAGEDKV_ERR_UNKNOWN_REQUEST, "9", pagedkv_set_retention(m, 9, &keep, 1, sizeof keep));
	EXPECT_FAIL(m, PAGEDKV_ERR_BAD_ARGUMENT, "range_size = 8", pagedkv_set_retention(m, 7, &keep, 1, 8));
	EXPECT_FAIL(m, PAGEDKV_ERR_BAD_ARGUMENT, "ranges is NULL", pagedkv_set_retention(m, 7, NULL, 1, sizeof keep));
	bad = keep;
	bad.reserved = 1;
	EXPECT_FAIL(m, PAGEDKV_ERR_BAD_ARGUMENT, "reserved = 1", pagedkv_set_retention(m, 7, &bad, 1, sizeof bad));
	bad = keep;
	bad.start = 8;
	bad.end = 4;
	EXPECT_FAIL(m, PAGEDKV_ERR_BAD_ARGUMENT, "tokens [8, 4)", pagedkv_set_retention(m, 7, &bad, 1, sizeof bad));
	EXPECT_FAIL(m, PAGEDKV_ERR_BAD_ARGUMENT, "now_ms = -1", pagedkv_set_clock(m, -1));
	OK(pagedkv_release(m, 7));

	// A TTL pin: the budget is 2 pages.
	uint64_t pin = 0;
	int64_t pinned = 0;
	EXPECT_FAIL(m, PAGEDKV_ERR_BAD_ARGUMENT, "ttl_ms = -1", pagedkv_pin_for(m, NULL, a, 8, -1, &pin, &pinned));
	OK(pagedkv_pin_for(m, NULL, a, 8, 5000, &pin, &pinned));
	CHECK(pinned == 8, "pinned %lld tokens, want 8", (long long)pinned);
	serve_one(m, 4, b, 9, 1, NULL, 0);
	uint64_t other = 0;
	EXPECT_FAIL(m, PAGEDKV_ERR_PIN_LIMIT, "over the pin budget of 2 pages (0.25 of 8)",
	            pagedkv_pin(m, NULL, b, 4, &other, &pinned));
	OK(pagedkv_set_clock(m, 4000));
	OK(pagedkv_evict(m, 8, &freed));
	OK(pagedkv_get_stats(m, &st, sizeof st));
	CHECK(st.pinned_pages == 2, "%lld pinned pages before the pin lapses, want 2", (long long)st.pinned_pages);
	OK(pagedkv_set_clock(m, 5000));
	OK(pagedkv_evict(m, 8, &freed));
	OK(pagedkv_get_stats(m, &st, sizeof st));
	CHECK(st.pinned_pages == 0 && st.cached_pages == 0, "after the pin lapsed: %lld pinned, %lld cached",
	      (long long)st.pinned_pages, (long long)st.cached_pages);
	EXPECT_FAIL(m, PAGEDKV_ERR_UNKNOWN_PIN, "pin", pagedkv_unpin(m, pin));
	OK(pagedkv_audit(m));
	OK(pagedkv_destroy(m));
	printf("retention: ok\n");
}

// state_groups runs a model with every new kind (docs/state-groups.md,
// docs/indexer-shared-kv.md): two Gated-DeltaNet-like state groups, a full
// and an MLA group, an indexer on the MLA group and shared-KV layers on
// the full one, with a checkpoint every 8 tokens and KV events. A prompt
// is prefilled to its checkpoints (next_state_checkpoint), a second
// request hits the last one and starts from a copy of its state; the
// events announce the checkpoints ("mamba"); every bad value is refused,
// named.
static void state_groups(void) {
	pagedkv_layer_group groups[] = {
	    {.kind = PAGEDKV_GROUP_STATE, .num_layers = 1, .conv_shape = {8, 3}, .conv_dtype = PAGEDKV_STATE_BF16,
	     .ssm_shape = {2, 4, 8}, .ssm_dtype = PAGEDKV_STATE_F32, .page_bytes = 4096},
	    {.kind = PAGEDKV_GROUP_FULL, .num_layers = 1},
	    {.kind = PAGEDKV_GROUP_STATE, .num_layers = 1, .conv_shape = {8, 3}, .conv_dtype = PAGEDKV_STATE_BF16,
	     .ssm_shape = {2, 4, 8}, .ssm_dtype = PAGEDKV_STATE_F32, .page_bytes = 4096},
	    {.kind = PAGEDKV_GROUP_MLA, .num_layers = 1},
	    {.kind = PAGEDKV_GROUP_INDEXER, .num_layers = 1, .target = 3, .indexer_head_dim = 128, .indexer_quant_block = 128},
	    {.kind = PAGEDKV_GROUP_SHARED_KV, .num_layers = 2, .target = 1},
	};
	enum { ng = 6 };
	pagedkv_config cfg = {.num_pages = 64, .page_size = 4, .hash_seed = 1, .state_checkpoint_every = 8};
	pagedkv_events_config ec = {.queue_batches = 16};
	pagedkv_options opts = {.events = &ec, .events_size = sizeof ec};
	pagedkv_manager m = 0;
	OK(pagedkv_hybrid_create_ex(&cfg, sizeof cfg, groups, ng, sizeof groups[0], &opts, sizeof opts, &m));
	int64_t n = 0;
	OK(pagedkv_hybrid_num_groups(m, &n));
	CHECK(n == ng, "num_groups %lld", (long long)n);
	int32_t prompt[13];
	for (int i = 0; i < 13; i++) prompt[i] = 100 + i;
	pagedkv_request req = prompt_request(prompt, 12);
	OK(pagedkv_add(m, 1, &req, NULL));
	uint64_t ids[] = {1};
	int32_t nt[1];
	pagedkv_array copies, si;
	pagedkv_group_plan gp[ng];
	int64_t next = 0;
	int32_t slot = -1;
	for (int want = 8; want <= 12; want += 4) {
		OK(pagedkv_hybrid_next_state_checkpoint(m, 1, &next));
		CHECK(next == want, "next state checkpoint %lld, want %d", (long long)next, want);
		pagedkv_request_state rs;
		OK(pagedkv_hybrid_request_state(m, 0, 1, &rs));
		nt[0] = (int32_t)(next - rs.computed);
		OK(pagedkv_hybrid_reserve(m, ids, nt, 1, &copies, gp, ng));
		for (int g = 0; g < ng; g++) {
			OK(pagedkv_hybrid_state_indices(m, g, &si));
			int state = groups[g].kind == PAGEDKV_GROUP_STATE;
			CHECK(si.len == (state ? 1 : 0), "group %d: %lld state indices", g, (long long)si.len);
			CHECK(state || gp[g].plan.kv_indptr.len == 2, "group %d has no page table", g);
		}
		OK(pagedkv_hybrid_state_indices(m, 0, &si));
		CHECK(slot < 0 || si.data[0] != slot, "the step after a checkpoint writes a fresh slot");
		CHECK(slot < 0 || gp[0].plan.copies.len == 3, "group 0 copies %lld, want one copy", (long long)gp[0].plan.copies.len);
		slot = si.data[0];
		int32_t s1[] = {want == 12 ? 7 : -1};
		OK(pagedkv_commit(m, s1, 1));
	}
	OK(pagedkv_hybrid_next_state_checkpoint(m, 1, &next));
	CHECK(next == 0, "next state checkpoint after the prompt %lld, want 0", (long long)next);
	pagedkv_group_stats gs;
	OK(pagedkv_hybrid_get_group_stats(m, 2, &gs, sizeof gs));
	CHECK(gs.kind == PAGEDKV_GROUP_STATE && gs.cached_pages == 2 && gs.published_pages == 2,
	      "state group 2: kind %lld, %lld checkpoints, %lld published", (long long)gs.kind, (long long)gs.cached_pages,
	      (long long)gs.published_pages);
	OK(pagedkv_hybrid_get_group_stats(m, 4, &gs, sizeof gs));
	CHECK(gs.kind == PAGEDKV_GROUP_INDEXER, "group 4 kind %lld", (long long)gs.kind);
	OK(pagedkv_hybrid_get_group_stats(m, 5, &gs, sizeof gs));
	CHECK(gs.kind == PAGEDKV_GROUP_SHARED_KV, "group 5 kind %lld", (long long)gs.kind);
	const uint8_t *ev = NULL;
	int64_t evn = 0, mamba = 0;
	for (;;) {
		OK(pagedkv_drain_events(m, &ev, &evn));
		if (evn == 0) break;
		mamba += contains(ev, evn, "mamba");
	}
	CHECK(mamba > 0, "no batch announced a checkpoint (\"mamba\")");
	// A second request of the prompt and one token more hits the checkpoint
	// at 12 and starts from a copy of its state.
	req = prompt_request(prompt, 13);
	int64_t matched = 0;
	OK(pagedkv_add(m, 2, &req, &matched));
	CHECK(matched == 12, "the second request matched %lld tokens, want 12", (long long)matched);
	ids[0] = 2;
	nt[0] = 1;
	OK(pagedkv_hybrid_reserve(m, ids, nt, 1, &copies, gp, ng));
	OK(pagedkv_hybrid_state_indices(m, 2, &si));
	CHECK(gp[2].plan.copies.len == 3 && gp[2].plan.copies.data[1] == si.data[0] && gp[2].plan.copies.data[2] == 4,
	      "restore copy of group 2: %lld words, into slot %d", (long long)gp[2].plan.copies.len, si.data[0]);
	OK(pagedkv_abort(m));
	OK(pagedkv_audit(m));

	// C-only mistakes.
	EXPECT_FAIL_H(m, PAGEDKV_ERR_BAD_ARGUMENT, "group = 6", pagedkv_hybrid_state_indices(m, 6, &si));
	EXPECT_FAIL_H(m, PAGEDKV_ERR_BAD_ARGUMENT, "out is NULL", pagedkv_hybrid_state_indices(m, 0, NULL));
	EXPECT_FAIL_H(m, PAGEDKV_ERR_BAD_ARGUMENT, "tokens is NULL", pagedkv_hybrid_next_state_checkpoint(m, 1, NULL));
	pagedkv_manager d = create(16, 4, 0);
	CHECK(pagedkv_hybrid_next_state_checkpoint(d, 1, &next) == PAGEDKV_ERR_BAD_HANDLE &&
	          strstr(pagedkv_last_error(), "is a dense manager") != NULL,
	      "next_state_checkpoint on a dense handle: %s", pagedkv_last_error());
	OK(pagedkv_destroy(d));
	OK(pagedkv_destroy(m));

	// Bad groups and configs: each refused, named, no handle written.
	struct {
		const char *name;
		int group, field; // field: index into the group's int64 fields
		int64_t value;
		int32_t code;
		const char *want;
	} cases[] = {
	    {"kind", 0, 0, 7, PAGEDKV_ERR_BAD_ARGUMENT, "groups[0].kind = 7"},
	    {"conv dtype", 0, 9, 9, PAGEDKV_ERR_BAD_ARGUMENT, "groups[0].conv_dtype = 9"},
	    {"ssm dtype", 2, 13, -1, PAGEDKV_ERR_BAD_ARGUMENT, "groups[2].ssm_dtype = -1"},
	    {"no conv dtype", 0, 9, 0, PAGEDKV_ERR_BAD_CONFIG, "ConvDType"},
	    {"ssm shape", 2, 11, 0, PAGEDKV_ERR_BAD_CONFIG, "SSMShape[1] = 0"},
	    {"state too big", 0, 14, 64, PAGEDKV_ERR_BAD_CONFIG, "PageBytes = 64"},
	    {"indexer target", 4, 4, 1, PAGEDKV_ERR_BAD_CONFIG, "Target = 1"},
	    {"indexer head dim", 4, 5, 0, PAGEDKV_ERR_BAD_CONFIG, "IndexerHeadDim = 0"},
	    {"indexer quant block", 4, 6, 48, PAGEDKV_ERR_BAD_CONFIG, "IndexerQuantBlock = 48"},
	    {"shared-KV target", 5, 4, 9, PAGEDKV_ERR_BAD_CONFIG, "Target = 9"},
	    {"attention with a state", 1, 7, 8, PAGEDKV_ERR_BAD_CONFIG, "State shape"},
	};
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		pagedkv_layer_group bad[ng];
		memcpy(bad, groups, sizeof bad);
		((int64_t *)&bad[cases[i].group])[cases[i].field] = cases[i].value;
		pagedkv_manager h = 12345;
		int32_t rc = pagedkv_hybrid_create(&cfg, sizeof cfg, bad, ng, sizeof bad[0], &h);
		CHECK(rc == cases[i].code && strstr(pagedkv_last_error(), cases[i].want) != NULL && h == 12345,
		      "bad group, %s: rc %d: %s", cases[i].name, rc, pagedkv_last_error());
		checked++;
	}
	pagedkv_manager h = 12345;
	cfg.state_checkpoint_every = 6;
	CHECK(pagedkv_hybrid_create(&cfg, sizeof cfg, groups, ng, sizeof groups[0], &h) == PAGEDKV_ERR_BAD_CONFIG &&
	          strstr(pagedkv_last_error(), "StateCheckpointEvery = 6") != NULL && h == 12345,
	      "state_checkpoint_every 6: %s", pagedkv_last_error());
	cfg.state_checkpoint_every = -8;
	CHECK(pagedkv_hybrid_create(&cfg, sizeof cfg, groups, ng, sizeof groups[0], &h) == PAGEDKV_ERR_BAD_ARGUMENT &&
	          strstr(pagedkv_last_error(), "state_checkpoint_every = -8") != NULL && h == 12345,
	      "state_checkpoint_every -8: %s", pagedkv_last_error());
	cfg.state_checkpoint_every = 8;
	CHECK(pagedkv_create(&cfg, sizeof cfg, &h) == PAGEDKV_ERR_BAD_ARGUMENT &&
	          strstr(pagedkv_last_error(), "state_checkpoint_every = 8") != NULL && h == 12345,
	      "dense state_checkpoint_every: %s", pagedkv_last_error());
	// A caller of the header before the state fields: 4 fields a group.
	int64_t old[2][4] = {{PAGEDKV_GROUP_SLIDING, 8, 0, 1}, {PAGEDKV_GROUP_FULL, 0, 0, 1}};
	cfg.state_checkpoint_every = 0;
	OK(pagedkv_hybrid_create(&cfg, offsetof(pagedkv_config, state_checkpoint_every), (pagedkv_layer_group *)old, 2,
	                         offsetof(pagedkv_layer_group, target), &h));
	OK(pagedkv_destroy(h));
	h = 12345;
	CHECK(pagedkv_hybrid_create(&cfg, sizeof cfg, groups, ng, 40, &h) == PAGEDKV_ERR_BAD_ARGUMENT &&
	          strstr(pagedkv_last_error(), "group_size = 40") != NULL && h == 12345,
	      "group_size 40: %s", pagedkv_last_error());
	checked += 8;
	printf("state groups: ok\n");
}

int main(void) {
	CHECK(pagedkv_abi_version() == PAGEDKV_ABI_VERSION, "library ABI %d, header %d", pagedkv_abi_version(),
	      PAGEDKV_ABI_VERSION);
	CHECK(strcmp(pagedkv_last_error(), "") == 0, "fresh thread has an error message");
	example();
	bad_config();
	hybrid();
	tiers();
	hybrid_tiers();
	state_groups();
	padded();
	sweep();
	step_buffers();
	cache_usage();
	retention();
	if (failures) {
		fprintf(stderr, "pagedkv_test: %d failures\n", failures);
		return 1;
	}
	printf("pagedkv_test: ok (%d failing calls checked)\n", checked);
	return 0;
}
